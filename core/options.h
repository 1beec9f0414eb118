/* kvshim options: the one configuration table (design §12).
 *
 * Every KVSHIM_* variable is one row of KVS_OPTION_TABLE: field, variable, type, default,
 * bounds, choices, unit, help. The same row generates the struct field, the parser entry and
 * the rendered line. Options are read once from an environment block at init; hooks read the
 * resolved struct, never getenv. An invalid value is reported once (one warning per variable)
 * and the default is kept; an unknown KVSHIM_* variable is reported too (it is likely a typo).
 *
 * Types: BOOL (1/0, true/false, on/off, yes/no), SIZE (bytes; suffixes K/M/G/T, KB/MB/GB/TB
 * and KiB/MiB/GiB/TiB, all binary), INT (bounded integer, unit in the table), ENUM (one of the
 * '|'-separated choices; the value is its index), FLAGS (auto or a comma list of the choices;
 * the value is a bit mask, KVS_HOOKS_AUTO for auto), STR (at most KVS_OPT_STR_MAX-1 bytes),
 * NAME (a STR of [A-Za-z0-9._-], non-empty), UIDS (a comma list of numeric uids). */
#ifndef KVSHIM_OPTIONS_H
#define KVSHIM_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_OPT_STR_MAX 256

/* The shortest lease any kvshim grants (KVSHIM_LEASE_MS's lower bound): a peer's copy done
 * within this of its PREPARE_RETRIEVE cannot have outlived its pins. */
#define KVS_LEASE_MIN_MS 10
/* X(field, ENV, TYPE, default, min, max, choices, unit, help) */
#define KVS_OPTION_TABLE(X)                                                                   \
  X(enable, "KVSHIM_ENABLE", BOOL, "1", 0, 1, "", "", "0 = every hook passes straight through") \
  X(hooks, "KVSHIM_HOOKS", FLAGS, "auto", 0, 0, "cuda|llama|kvo", "",                          \
    "hook families to enable (auto = those found in the process)")                            \
  X(pool_size, "KVSHIM_POOL_SIZE", SIZE, "1G", 1ull << 20, 1ull << 40, "", "bytes",           \
    "cache arena size")                                                                       \
  X(host_pool_size, "KVSHIM_HOST_POOL_SIZE", SIZE, "4G", 0, 1ull << 40, "", "bytes",          \
    "host arena for CUDA host allocations (0 = off; backed lazily)")                          \
  X(host_min, "KVSHIM_HOST_MIN", SIZE, "1M", 0, 1ull << 40, "", "bytes",                      \
    "smallest host allocation redirected")                                                    \
  X(hugepages, "KVSHIM_HUGEPAGES", BOOL, "0", 0, 1, "", "", "back the pool with huge pages")   \
  X(pool_name, "KVSHIM_POOL_NAME", STR, "", 0, 0, "", "",                                     \
    "kvshim serve only: also expose the pool under this shm name")                            \
  X(strategy, "KVSHIM_STRATEGY", ENUM, "auto", 0, 0, "auto|shm|inline", "",                   \
    "transfer strategy per connection")                                                       \
  X(group, "KVSHIM_GROUP", NAME, "default", 0, 0, "", "", "peer group name")                   \
  X(run_dir, "KVSHIM_RUN_DIR", STR, "", 0, 0, "", "",                                         \
    "socket directory (default $XDG_RUNTIME_DIR/kvshim or /tmp/kvshim-$UID)")                  \
  X(peers, "KVSHIM_PEERS", BOOL, "1", 0, 1, "", "", "0 = no coordinator, local cache only")    \
  X(push, "KVSHIM_PUSH", ENUM, "auto", 0, 0, "auto|off", "",                                  \
    "push committed objects to a kvshim serve cache peer")                                    \
  X(chunk_tokens, "KVSHIM_CHUNK_TOKENS", INT, "256", 1, 1 << 20, "", "tokens",                \
    "tokens per chunk")                                                                       \
  X(salt, "KVSHIM_SALT", STR, "", 0, 0, "", "", "isolates tenants sharing a group")            \
  X(lease_ms, "KVSHIM_LEASE_MS", INT, "30000", KVS_LEASE_MIN_MS, 86400000, "", "ms",                        \
    "lease deadline backstop")                                                                \
  X(rpc_timeout_ms, "KVSHIM_RPC_TIMEOUT_MS", INT, "2000", 1, 600000, "", "ms",                \
    "per-call deadline to a peer")                                                            \
  X(max_frame, "KVSHIM_MAX_FRAME", SIZE, "64M", 64ull << 10, 1ull << 30, "", "bytes",         \
    "largest frame accepted")                                                                 \
  X(allow_uids, "KVSHIM_ALLOW_UIDS", UIDS, "", 0, 0, "", "", "extra uids allowed to connect")  \
  X(llama_write_through, "KVSHIM_LLAMA_WRITE_THROUGH", BOOL, "1", 0, 1, "", "",               \
    "also write the engine's state files")                                                    \
  X(llama_prefix, "KVSHIM_LLAMA_PREFIX", BOOL, "1", 0, 1, "", "",                             \
    "transparent prefix cache for llama.cpp")                                                 \
  X(llama_min_tokens, "KVSHIM_LLAMA_MIN_TOKENS", INT, "256", 1, 1 << 24, "", "tokens",        \
    "smallest prefix worth restoring")                                                        \
  X(llama_chunks, "KVSHIM_LLAMA_CHUNKS", BOOL, "0", 0, 1, "", "",                             \
    "llama prefix cache: store states as one object per chunk, each chunk once (design 10.4)") \
  X(log, "KVSHIM_LOG", ENUM, "warn", 0, 0, "off|error|warn|info|debug|trace", "",             \
    "log level")                                                                              \
  X(log_file, "KVSHIM_LOG_FILE", STR, "", 0, 0, "", "", "log destination (default stderr)")    \
  X(stats, "KVSHIM_STATS", STR, "", 0, 0, "", "", "path: JSON stats written at exit")        \
  X(remote, "KVSHIM_REMOTE", STR, "", 0, 0, "", "",                                           \
    "kvshim serve only: redis://[user:pass@]host:port[/db] or redis+cluster://host:port[,...]") \
  X(remote_password_file, "KVSHIM_REMOTE_PASSWORD_FILE", STR, "", 0, 0, "", "",               \
    "file holding the remote store's password (overrides one in the URL)")                    \
  X(remote_ttl, "KVSHIM_REMOTE_TTL", INT, "86400000", 1000, 31536000000, "", "ms",            \
    "expiry of values written to the remote store (SET ... PX)")                              \
  X(remote_timeout_ms, "KVSHIM_REMOTE_TIMEOUT_MS", INT, "1000", 1, 600000, "", "ms",          \
    "deadline of each remote call (connect, pipeline)")                                       \
  X(remote_threads, "KVSHIM_REMOTE_THREADS", INT, "2", 1, 64, "", "threads",                  \
    "remote I/O threads (each with its own connection)")                                      \
  X(remote_queue, "KVSHIM_REMOTE_QUEUE", INT, "1024", 1, 1048576, "", "objects",              \
    "write-behind queue to the remote store (a full queue drops and counts)")                 \
  X(cuda_pin_arena, "KVSHIM_CUDA_PIN_ARENA", BOOL, "1", 0, 1, "", "",                         \
    "pin the CUDA host arena on demand in 64 MiB pieces (0: register each buffer inline)")   \
  X(one_copy, "KVSHIM_ONE_COPY", BOOL, "1", 0, 1, "", "",                                     \
    "with a kvshim serve cache peer: store into and load from its pool, keep no own copy")    \
  X(pool_lean_size, "KVSHIM_POOL_LEAN_SIZE", SIZE, "32M", 1ull << 20, 1ull << 40, "", "bytes", \
    "usable pool while a cache peer is in the group (KVSHIM_POOL_SIZE without one)")           \
  X(llama_wait_ms, "KVSHIM_LLAMA_WAIT_MS", INT, "5000", 0, 600000, "", "ms",                  \
    "llama prefix cache: longest wait for another process computing the same prefix (0: never)") \
  X(disk, "KVSHIM_DISK", STR, "", 0, 0, "", "",                                               \
    "kvshim serve only: directory of the disk tier below the pool (empty = off)")              \
  X(disk_size, "KVSHIM_DISK_SIZE", SIZE, "10G", 1ull << 20, 1ull << 50, "", "bytes",          \
    "disk tier bound: the oldest segments are deleted past it")                               \
  X(disk_sync, "KVSHIM_DISK_SYNC", ENUM, "batch", 0, 0, "none|batch|always", "",              \
    "disk tier fsync: none, batch (when the write queue drains, every 64 MiB) or always")

/* ENUM values, in the order of their choices strings. */
typedef enum { KVS_STRATEGY_AUTO = 0, KVS_STRATEGY_SHM = 1, KVS_STRATEGY_INLINE = 2 } kvs_strategy_t;
typedef enum { KVS_PUSH_AUTO = 0, KVS_PUSH_OFF = 1 } kvs_push_t;
typedef enum { KVS_DISK_SYNC_NONE = 0, KVS_DISK_SYNC_BATCH = 1, KVS_DISK_SYNC_ALWAYS = 2 } kvs_disk_sync_t;
/* FLAGS bits for KVSHIM_HOOKS, in the order of its choices string. */
#define KVS_HOOK_CUDA  (1u << 0)
#define KVS_HOOK_LLAMA (1u << 1)
#define KVS_HOOK_KVO   (1u << 2)
#define KVS_HOOKS_AUTO (1u << 31)

#define KVS__OPT_DECL_BOOL(f)  int f;
#define KVS__OPT_DECL_SIZE(f)  uint64_t f;
#define KVS__OPT_DECL_INT(f)   int64_t f;
#define KVS__OPT_DECL_ENUM(f)  int f;
#define KVS__OPT_DECL_FLAGS(f) unsigned f;
#define KVS__OPT_DECL_STR(f)   char f[KVS_OPT_STR_MAX];
#define KVS__OPT_DECL_NAME(f)  char f[KVS_OPT_STR_MAX];
#define KVS__OPT_DECL_UIDS(f)  char f[KVS_OPT_STR_MAX];

typedef enum kvs_option_id {
#define KVS__OPT_ENUM(f, env, type, def, lo, hi, choices, unit, help) KVS_OPT_##f,
  KVS_OPTION_TABLE(KVS__OPT_ENUM)
#undef KVS__OPT_ENUM
  KVS_OPT__COUNT
} kvs_option_id_t;

typedef enum kvs_option_source {
  KVS_OPT_FROM_DEFAULT = 0, /* not set */
  KVS_OPT_FROM_ENV = 1,     /* set and valid */
  KVS_OPT_INVALID = 2,      /* set, invalid: default kept, warned once */
} kvs_option_source_t;

/* The resolved configuration. Plain data: copy it freely. */
typedef struct kvs_options {
#define KVS__OPT_FIELD(f, env, type, def, lo, hi, choices, unit, help) KVS__OPT_DECL_##type(f)
  KVS_OPTION_TABLE(KVS__OPT_FIELD)
#undef KVS__OPT_FIELD
  unsigned char source[KVS_OPT__COUNT]; /* kvs_option_source_t per row */
  unsigned unknown_vars;                /* KVSHIM_* variables that match no row */
} kvs_options_t;

/* Flags for kvs_options_load. */
#define KVS_OPTIONS_APPLY_LOG 1u /* set the log level and KVSHIM_LOG_FILE before warning */

/* Fill *o from an environment block (NULL-terminated "NAME=value" strings; NULL = environ).
 * Defaults first, then each KVSHIM_* entry; XDG_RUNTIME_DIR and the uid give run_dir's
 * default. Every invalid value and unknown KVSHIM_* name is warned about once through the log.
 * Returns the number of problems found (>= 0); *o is always fully usable. */
int kvs_options_load(kvs_options_t *o, char *const *envp, unsigned flags);
/* Defaults only (no environment, no warnings). */
void kvs_options_defaults(kvs_options_t *o);

/* Render the resolved table, one line per row: "KVSHIM_POOL_SIZE=1G (default) - help".
 * snprintf semantics: returns the length needed; buf is always NUL-terminated when cap > 0. */
size_t kvs_options_render(const kvs_options_t *o, char *buf, size_t cap);
/* Render one value canonically ("1G", "on", "shm", "cuda,kvo"). */
size_t kvs_options_format_value(const kvs_options_t *o, kvs_option_id_t id, char *buf, size_t cap);

const char *kvs_options_env_name(kvs_option_id_t id);
/* The variables as `kvshim --help` lists them, one line per row of the table: "  KVSHIM_LEASE_MS
 * (--lease-ms) integer 10..86400000 ms, default 30000: lease deadline backstop". snprintf
 * semantics, as kvs_options_render. */
size_t kvs_options_usage(char *buf, size_t cap);
/* Parse one value for a row into *o (used by the CLI, whose flags mirror the variables).
 * Returns 0, or -EINVAL/-ERANGE with *o unchanged. */
int kvs_options_set(kvs_options_t *o, kvs_option_id_t id, const char *value);
/* Find a row by variable name ("KVSHIM_POOL_SIZE") or field name ("pool_size"). */
int kvs_options_find(const char *name, kvs_option_id_t *out);

/* uid == getuid() or listed in KVSHIM_ALLOW_UIDS. */
int kvs_options_uid_allowed(const kvs_options_t *o, uid_t uid);

#ifdef __cplusplus
}
#endif
#endif
