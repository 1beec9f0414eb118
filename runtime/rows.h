/* kvshim runtime: the process's tables of rows, composed (design §2, §12, §13). Each layer owns
 * its option and stat rows: core's are in core/options.h and core/stats.h, the runtime's own
 * (those only runtime/ reads or counts) below, and each hook family's in its
 * shims/<name>/<name>_rows.h. This header puts them together, core's first, then the
 * runtime's, then each family's in the order of shims/families.h, so a family adds its rows in
 * its own folder and nowhere else:
 *
 *   kvs_config_t        the configuration: core's kvs_options_t (what core's functions are
 *                       given, &c->core), then a field per row of the others
 *   KVS_OPT_<field>     every option's id (core's the same as in core/options.h)
 *   kvs_config_rows()   the option table over kvs_config_t (kvs_config_load & co. walk it)
 *   KVS_STAT_<name>     every stat's id; KVS_STAT__COUNT of them
 *   kvs_config_stats()  the stat table, installed with kvs_stats_use_table
 *   KVS_HOOK_<ID>       a family's KVSHIM_HOOKS bit: 1u << its position in shims/families.h
 *
 * The tables are generated in each file that uses them (static inline), so the runtime, the
 * CLI and the tests read the same rows without linking one more object. shims/families.h and
 * the *_rows.h it includes are rows only: the one exception to "includes point down" (design
 * §2, tests/runtime/check_layering.py), taken by this header alone. */
#ifndef KVSHIM_RUNTIME_ROWS_H
#define KVSHIM_RUNTIME_ROWS_H

#include <stddef.h>

#include "../shims/families.h" /* by its path: every target reading runtime/ finds it */
#include "options.h"
#include "stats.h"

/* ---- the families' KVSHIM_HOOKS bits and choices -------------------------------------------- */

enum {
#define KVS__HOOK_POS(id, name, title, rows) KVS__HOOK_POS_##id,
  KVS_HOOK_FAMILIES(KVS__HOOK_POS)
#undef KVS__HOOK_POS
  KVS__HOOK_FAMILY_COUNT
};
_Static_assert(KVS__HOOK_FAMILY_COUNT < 31, "a family's bit stays below KVS_HOOKS_AUTO");
enum {
#define KVS__HOOK_BIT(id, name, title, rows) KVS_HOOK_##id = 1 << KVS__HOOK_POS_##id,
  KVS_HOOK_FAMILIES(KVS__HOOK_BIT)
#undef KVS__HOOK_BIT
};
/* "cuda|llama|kvo": the families' names in their order (a FLAGS row's choices), past the
 * leading '|' of the concatenation (indexed, not "+ 1": clang's -Wstring-plus-int). */
#define KVS__HOOK_CHOICE(id, name, title, rows) "|" #name
#define KVS__HOOK_CHOICES (&(KVS_HOOK_FAMILIES(KVS__HOOK_CHOICE))[1])

/* ---- the runtime's own rows ----------------------------------------------------------------- */

/* X(field, ENV, TYPE, default, min, max, choices, unit, help), as core/options.h's rows. */
#define KVS_RUNTIME_OPTIONS(X)                                                                \
  X(enable, "KVSHIM_ENABLE", BOOL, "1", 0, 1, "", "", "0 = every hook passes straight through") \
  X(hooks, "KVSHIM_HOOKS", FLAGS, "auto", 0, 0, KVS__HOOK_CHOICES, "",                         \
    "hook families to enable (auto = those found in the process)")                            \
  X(host_pool_size, "KVSHIM_HOST_POOL_SIZE", SIZE, "4G", 0, 1ull << 40, "", "bytes",          \
    "host arena for CUDA host allocations (0 = off; backed lazily)")                          \
  X(stats, "KVSHIM_STATS", STR, "", 0, 0, "", "", "path: JSON stats written at exit")        \
  X(one_copy, "KVSHIM_ONE_COPY", BOOL, "1", 0, 1, "", "",                                     \
    "with a kvshim serve cache peer: store into and load from its pool, keep no own copy")    \
  X(pool_lean_size, "KVSHIM_POOL_LEAN_SIZE", SIZE, "32M", 1ull << 20, 1ull << 40, "", "bytes", \
    "usable pool while a cache peer is in the group (KVSHIM_POOL_SIZE without one)")

/* X(name, kind, help), as core/stats.h's rows. Append only. */
#define KVS_RUNTIME_STATS(X)                                                                  \
  X(hook_calls, C, "hooked calls that reached kvshim")                                        \
  X(hook_fallbacks, C, "hooked calls passed to the real function after an internal problem")  \
  X(hook_hits, C, "hooked loads served from the cache")                                       \
  X(hook_misses, C, "hooked loads passed to the engine")                                      \
  X(hook_stores, C, "hooked stores kept in the cache")                                        \
  X(hook_store_failures, C, "hooked stores the cache could not keep")                       \
  X(cache_peer_stores, C, "one copy: objects stored straight into the cache peer's pool")      \
  X(cache_peer_loads, C, "one copy: objects read from the cache peer's pool into the caller's") \
  X(cache_peer_fallbacks, C,                                                                  \
    "one copy: stores and loads the cache peer failed, served by the own pool instead")

/* ---- composed ------------------------------------------------------------------------------- */

/* A family's rows through one generator each (the preprocessor cannot hand a generator on
 * through KVS_HOOK_FAMILIES's rows). */
#define KVS__FAMILY_OPTION_DECL(id, name, title, rows) KVS_##id##_OPTIONS(KVS_OPTION_DECL)
#define KVS__FAMILY_OPTION_ENUM(id, name, title, rows) KVS_##id##_OPTIONS(KVS_OPTION_ENUM)
#define KVS__FAMILY_OPTION_ROW(id, name, title, rows) KVS_##id##_OPTIONS(KVS__CONFIG_ROW)
#define KVS__FAMILY_STAT_ENUM(id, name, title, rows) KVS_##id##_STATS(KVS_STAT_ENUM)
#define KVS__FAMILY_STAT_ROW(id, name, title, rows) KVS_##id##_STATS(KVS_STAT_ROW)
#define KVS__CONFIG_CORE_ROW(...) KVS_OPTION_ROW(kvs_options_t, __VA_ARGS__)
#define KVS__CONFIG_ROW(...) KVS_OPTION_ROW(kvs_config_t, __VA_ARGS__)

/* Option ids past core's. */
enum {
  KVS__OPT_CORE_LAST = KVS_OPT__CORE - 1,
  KVS_RUNTIME_OPTIONS(KVS_OPTION_ENUM)
  KVS_HOOK_FAMILIES(KVS__FAMILY_OPTION_ENUM)
  KVS_OPT__COUNT
};
_Static_assert(KVS_OPT__COUNT <= KVS_OPT_MAX, "more option rows than KVS_OPT_MAX (options.h)");

/* The resolved configuration of the process. Plain data: copy it freely. */
typedef struct kvs_config {
  kvs_options_t core; /* core's rows, and the record of every row (source[], unknown_vars) */
  KVS_RUNTIME_OPTIONS(KVS_OPTION_DECL)
  KVS_HOOK_FAMILIES(KVS__FAMILY_OPTION_DECL)
} kvs_config_t;

/* Stat ids past core's. */
enum {
  KVS__STAT_CORE_LAST = KVS_STAT__CORE - 1,
  KVS_RUNTIME_STATS(KVS_STAT_ENUM)
  KVS_HOOK_FAMILIES(KVS__FAMILY_STAT_ENUM)
  KVS_STAT__COUNT
};
_Static_assert(KVS_STAT__COUNT <= KVS_STATS_MAX, "more stat rows than KVS_STATS_MAX (stats.h)");

static inline const kvs_option_table_t *kvs_config_rows(void) {
  static const kvs_option_row_t rows[] = {
      KVS_CORE_OPTIONS(KVS__CONFIG_CORE_ROW)
      KVS_RUNTIME_OPTIONS(KVS__CONFIG_ROW)
      KVS_HOOK_FAMILIES(KVS__FAMILY_OPTION_ROW)
  };
  _Static_assert(sizeof rows / sizeof rows[0] == KVS_OPT__COUNT, "one row per option id");
  static const kvs_option_table_t table = {rows, KVS_OPT__COUNT, sizeof(kvs_config_t)};
  return &table;
}

static inline const kvs_stat_table_t *kvs_config_stats(void) {
  static const kvs_stat_row_t rows[] = {
      KVS_CORE_STATS(KVS_STAT_ROW)
      KVS_RUNTIME_STATS(KVS_STAT_ROW)
      KVS_HOOK_FAMILIES(KVS__FAMILY_STAT_ROW)
  };
  _Static_assert(sizeof rows / sizeof rows[0] == KVS_STAT__COUNT, "one row per stat id");
  static const kvs_stat_table_t table = {rows, KVS_STAT__COUNT};
  return &table;
}

/* core/options.h's machine over kvs_config_rows(): see kvs_options_load_rows and the rest. */
static inline int kvs_config_load(kvs_config_t *c, char *const *envp, unsigned flags) {
  return kvs_options_load_rows(kvs_config_rows(), c, envp, flags);
}
static inline void kvs_config_defaults(kvs_config_t *c) {
  kvs_options_defaults_rows(kvs_config_rows(), c);
}
static inline size_t kvs_config_render(const kvs_config_t *c, char *buf, size_t cap) {
  return kvs_options_render(kvs_config_rows(), c, buf, cap);
}
static inline size_t kvs_config_format_value(const kvs_config_t *c, kvs_option_id_t id,
                                             char *buf, size_t cap) {
  return kvs_options_format_value(kvs_config_rows(), c, id, buf, cap);
}
static inline int kvs_config_set(kvs_config_t *c, kvs_option_id_t id, const char *value) {
  return kvs_options_set(kvs_config_rows(), c, id, value);
}
static inline size_t kvs_config_usage(char *buf, size_t cap) {
  return kvs_options_usage(kvs_config_rows(), buf, cap);
}
static inline int kvs_config_find(const char *name, kvs_option_id_t *out) {
  return kvs_options_find(kvs_config_rows(), name, out);
}
static inline const char *kvs_config_env_name(kvs_option_id_t id) {
  return kvs_options_env_name(kvs_config_rows(), id);
}

#endif
