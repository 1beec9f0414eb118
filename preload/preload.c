/* preload: the assembly of libkvshim.so (design §2). The only file that names every hook
 * family: their list, the constructor and the fork handlers. The runtime they stand on is
 * runtime/ (runtime.h: the life of the process); the dlsym trampoline is dlsym.c; the export
 * map is exports.map.c. A new family adds its row here and its objects in CMakeLists.txt. */
#include <pthread.h>

#include "hooks.h"
#include "internal.h"
#include "runtime.h"

/* X(name): the family object kvs__family_<name>, defined by its shim. Order is the order of
 * init and of the dlsym name match. */
#define KVS_PRELOAD_FAMILIES(X) X(cuda) X(llama) X(llama_prefix) X(kvo)

#define KVS__FAMILY_DECL(n) extern const kvs__family_t kvs__family_##n;
KVS_PRELOAD_FAMILIES(KVS__FAMILY_DECL)
#undef KVS__FAMILY_DECL

const kvs__family_t *const kvs__families[] = {
#define KVS__FAMILY_PTR(n) &kvs__family_##n,
    KVS_PRELOAD_FAMILIES(KVS__FAMILY_PTR)
#undef KVS__FAMILY_PTR
};
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
