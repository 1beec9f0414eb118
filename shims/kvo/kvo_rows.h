/* shims/kvo: the option and stat rows of the kvo family, which only its code reads and
 * counts (design §2: each layer owns its rows). X(field, ENV, TYPE, default, min, max,
 * choices, unit, help) as core/options.h's rows; X(name, kind, help) as core/stats.h's.
 * runtime/rows.h composes them after core's and the runtime's, in the order of
 * shims/families.h, into the process's configuration (kvs_config_t) and stats table. This
 * header has no includes: it is rows only. */
#ifndef KVSHIM_KVO_ROWS_H
#define KVSHIM_KVO_ROWS_H

/* None yet: kvo counts through the runtime's hook_* rows. */
#define KVS_KVO_OPTIONS(X)

#define KVS_KVO_STATS(X)

#endif
