/* kvshim runtime: the tables of one hook family, generated from its rows (style rule 5).
 * A template: include it once, from the family's .c file, after defining its one row
 *
 *   #define KVS_FAMILY_OF(X) X(var, title, flag, prefix, HOOKS, USES, pfn_, get_)
 *
 *   var      the family object (const kvs__family_t, defined by the file with KVS__FAMILY_HEAD)
 *   title    its name in log lines ("llama.cpp"); flag: KVS_HOOK_*; prefix: of every hooked name
 *   HOOKS    the hooked rows, X(ret, name, params, args) (shims/<family>/<family>_hooks.h)
 *   USES     the rows it only calls (KVS__NO_ROWS when none)
 *   pfn_     prefix of the typed pointer type of a row (pfn_<name>)
 *   get_     prefix of the typed getter of a row (get_<name>(): the real function or NULL)
 *
 * It defines, in that file: typedef ret (*pfn_<name>) params for every row; the exported
 * declaration of every hook; enum rows kvs__row_<name>, KVS__NHOOKS, KVS__NROWS; the name and
 * wrapper tables; g_real, a union of the typed pointers (by name) and the untyped row array
 * the runtime writes (.row); the getters; and KVS__FAMILY_HEAD, the first fields of the
 * family's initializer. One family per file. */
#include <string.h>

#include "hooks.h"

#define KVS__FT_CAT2(a, b) a##b
#define KVS__FT_CAT(a, b) KVS__FT_CAT2(a, b)
#define KVS__FT_VAR_(v, t, f, p, h, u, pfn, get) v
#define KVS__FT_HOOKS_(v, t, f, p, h, u, pfn, get) h
#define KVS__FT_USES_(v, t, f, p, h, u, pfn, get) u
#define KVS__FT_PFN_(v, t, f, p, h, u, pfn, get) pfn
#define KVS__FT_GET_(v, t, f, p, h, u, pfn, get) get
#define KVS__FT_HEAD_(v, t, f, p, h, u, pfn, get) .name = t, .flag = f, .prefix = p
#define KVS_FAMILY_VAR KVS_FAMILY_OF(KVS__FT_VAR_)
#define KVS_FAMILY_HOOKS KVS_FAMILY_OF(KVS__FT_HOOKS_)
#define KVS_FAMILY_USES KVS_FAMILY_OF(KVS__FT_USES_)
#define KVS_FAMILY_PFN(name) KVS__FT_CAT(KVS_FAMILY_OF(KVS__FT_PFN_), name)
#define KVS_FAMILY_GET(name) KVS__FT_CAT(KVS_FAMILY_OF(KVS__FT_GET_), name)

#define KVS__FT_PFN(ret, name, params, args) typedef ret(*KVS_FAMILY_PFN(name)) params;
KVS_FAMILY_HOOKS(KVS__FT_PFN)
KVS_FAMILY_USES(KVS__FT_PFN)
#undef KVS__FT_PFN

#define KVS__FT_DECL(ret, name, params, args) ret name params __attribute__((visibility("default")));
KVS_FAMILY_HOOKS(KVS__FT_DECL)
#undef KVS__FT_DECL

enum {
#define KVS__FT_ENUM(ret, name, params, args) kvs__row_##name,
  KVS_FAMILY_HOOKS(KVS__FT_ENUM) KVS__NHOOKS,
  KVS__USES_START = KVS__NHOOKS - 1,
  KVS_FAMILY_USES(KVS__FT_ENUM) KVS__NROWS
#undef KVS__FT_ENUM
};

static const char *const kvs__row_names[KVS__NROWS] = {
#define KVS__FT_NAME(ret, name, params, args) [kvs__row_##name] = #name,
    KVS_FAMILY_HOOKS(KVS__FT_NAME) KVS_FAMILY_USES(KVS__FT_NAME)
#undef KVS__FT_NAME
};

static const kvs__code_t kvs__row_wrappers[KVS__NHOOKS] = {
#define KVS__FT_WRAPPER(ret, name, params, args) [kvs__row_##name] = (kvs__code_t)&name,
    KVS_FAMILY_HOOKS(KVS__FT_WRAPPER)
#undef KVS__FT_WRAPPER
};

typedef union kvs__family_real {
  struct {
#define KVS__FT_FIELD(ret, name, params, args) KVS_FAMILY_PFN(name) name;
    KVS_FAMILY_HOOKS(KVS__FT_FIELD)
    KVS_FAMILY_USES(KVS__FT_FIELD)
#undef KVS__FT_FIELD
  };
  kvs__code_t row[KVS__NROWS];
} kvs__family_real_t;
_Static_assert(sizeof(((kvs__family_real_t *)0)->row) == sizeof(kvs__family_real_t),
               "every row is one code pointer");

static kvs__family_real_t g_real;
static kvs__family_state_t kvs__family_state;
extern const kvs__family_t KVS_FAMILY_VAR;

#define KVS__FT_GETTER(ret, name, params, args)                                               \
  static inline KVS_FAMILY_PFN(name) KVS_FAMILY_GET(name)(void) {                             \
    return (KVS_FAMILY_PFN(name))kvs__family_real(&KVS_FAMILY_VAR, kvs__row_##name);          \
  }
KVS_FAMILY_HOOKS(KVS__FT_GETTER)
KVS_FAMILY_USES(KVS__FT_GETTER)
#undef KVS__FT_GETTER

#define KVS__FAMILY_HEAD                                                                      \
  KVS_FAMILY_OF(KVS__FT_HEAD_), .names = kvs__row_names, .wrappers = kvs__row_wrappers,       \
  .n_hooks = KVS__NHOOKS, .n_rows = KVS__NROWS, .real = g_real.row, .state = &kvs__family_state
