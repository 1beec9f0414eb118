/* preload: the assembly of libkvshim.so (design §2): the hook families of shims/families.h,
 * the constructor and the fork handlers. The runtime they stand on is
 * runtime/ (runtime.h: the life of the process); the dlsym trampoline is dlsym.c; the export
 * map is exports.map.c. */
#include <pthread.h>

#include "families.h"
#include "hooks.h"
#include "internal.h"
#include "runtime.h"

/* The family objects kvs__family_<object>, defined by the shims, in the order of
 * shims/families.h's KVS_HOOK_FAMILY_OBJECTS: the order of init and of the dlsym name match. */
#define KVS__FAMILY_DECL(id, object) extern const kvs__family_t kvs__family_##object;
KVS_HOOK_FAMILY_OBJECTS(KVS__FAMILY_DECL)
#undef KVS__FAMILY_DECL

const kvs__family_t *const kvs__families[] = {
#define KVS__FAMILY_PTR(id, object) &kvs__family_##object,
    KVS_HOOK_FAMILY_OBJECTS(KVS__FAMILY_PTR)
#undef KVS__FAMILY_PTR
};

/* A family's KVSHIM_HOOKS bit (KVS_HOOK_<ID>) is made from its row's position in
 * KVS_HOOK_FAMILIES by runtime/rows.h, with KVSHIM_HOOKS's choices in that order. */
const size_t kvs__n_families = KVS__ARRAY_LEN(kvs__families);

static void fork_prepare(void) { kvs__runtime_fork(0); }
static void fork_parent(void) { kvs__runtime_fork(1); }
static void fork_child(void) { kvs__runtime_fork(2); }

/* Everything the constructor does: every process that loads the library runs it. */
__attribute__((constructor)) static void preload_init(void) {
  kvs__runtime_loaded();
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

__attribute__((destructor)) static void preload_fini(void) { kvs__runtime_exit(); }
