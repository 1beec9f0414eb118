/* kvshim options: the configuration machine and core's rows of it (design §12).
 *
 * Every KVSHIM_* variable is one row: field, variable, type, default, bounds, choices, unit,
 * help. The same row generates the struct field, the parser entry and the rendered line.
 * Options are read once from an environment block at init; hooks read the resolved struct,
 * never getenv. An invalid value is reported once (one warning per variable) and the default is
 * kept; an unknown KVSHIM_* variable is reported too (it is likely a typo).
 *
 * Each layer owns its rows (design §2): KVS_CORE_OPTIONS here holds the rows core's own code
 * reads; the runtime's and each hook family's rows live with them, and runtime/rows.h composes
 * the process's table (kvs_config_t: this file's kvs_options_t first, then the others). The
 * machine below walks any such table (kvs_option_table_t); it knows no row beyond core's.
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
/* Rows a table may have in all: core's and those composed on top of them (runtime/rows.h
 * asserts its count against it). */
#define KVS_OPT_MAX 64

/* Core's rows: those core's code reads. X(field, ENV, TYPE, default, min, max, choices, unit,
 * help) */
#define KVS_CORE_OPTIONS(X)                                                                   \
  X(pool_size, "KVSHIM_POOL_SIZE", SIZE, "1G", 1ull << 20, 1ull << 40, "", "bytes",           \
    "cache arena size")                                                                       \
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
  X(log, "KVSHIM_LOG", ENUM, "warn", 0, 0, "off|error|warn|info|debug|trace", "",             \
    "log level")                                                                              \
  X(log_file, "KVSHIM_LOG_FILE", STR, "", 0, 0, "", "", "log destination (default stderr)")    \
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
/* A FLAGS value of "auto" (the bits of the choices are 1u << their position). */
#define KVS_HOOKS_AUTO (1u << 31)

typedef enum kvs_option_type {
  KVS_OPTION_BOOL, KVS_OPTION_SIZE, KVS_OPTION_INT, KVS_OPTION_ENUM, KVS_OPTION_FLAGS,
  KVS_OPTION_STR, KVS_OPTION_NAME, KVS_OPTION_UIDS
} kvs_option_type_t;

/* A row's id is its index in its table; core's rows come first in every table, so
 * KVS_OPT_<field> of a core row is the same everywhere. */
typedef unsigned kvs_option_id_t;

/* Generators for a layer's rows, X(field, ENV, TYPE, ...) as above: the struct field, the id
 * and the table row (with the struct the field lies in). */
#define KVS__OPT_DECL_BOOL(f)  int f;
#define KVS__OPT_DECL_SIZE(f)  uint64_t f;
#define KVS__OPT_DECL_INT(f)   int64_t f;
#define KVS__OPT_DECL_ENUM(f)  int f;
#define KVS__OPT_DECL_FLAGS(f) unsigned f;
#define KVS__OPT_DECL_STR(f)   char f[KVS_OPT_STR_MAX];
#define KVS__OPT_DECL_NAME(f)  char f[KVS_OPT_STR_MAX];
#define KVS__OPT_DECL_UIDS(f)  char f[KVS_OPT_STR_MAX];
#define KVS_OPTION_DECL(f, env, type, def, lo, hi, choices, unit, help) KVS__OPT_DECL_##type(f)
#define KVS_OPTION_ENUM(f, env, type, def, lo, hi, choices, unit, help) KVS_OPT_##f,
#define KVS_OPTION_ROW(block, f, env, type, def, lo, hi, choices, unit, help)                  \
  {#f, env, KVS_OPTION_##type, def, (uint64_t)(lo), (uint64_t)(hi), choices, unit, help,        \
   offsetof(block, f)},

enum { KVS_CORE_OPTIONS(KVS_OPTION_ENUM) KVS_OPT__CORE };

typedef enum kvs_option_source {
  KVS_OPT_FROM_DEFAULT = 0, /* not set */
  KVS_OPT_FROM_ENV = 1,     /* set and valid */
  KVS_OPT_INVALID = 2,      /* set, invalid: default kept, warned once */
} kvs_option_source_t;

/* Core's rows resolved, and what the machine records of every row of the table loaded: the
 * head of every options block (a composed struct has it as its first member). Plain data:
 * copy it freely. */
typedef struct kvs_options {
  KVS_CORE_OPTIONS(KVS_OPTION_DECL)
  unsigned char source[KVS_OPT_MAX]; /* kvs_option_source_t per row of the table loaded */
  unsigned unknown_vars;             /* KVSHIM_* variables that match no row */
} kvs_options_t;

/* A table of rows over one block: a struct whose first member is a kvs_options_t, the rows'
 * offsets into it. Core's rows first, in their order, then any others (n <= KVS_OPT_MAX). */
typedef struct kvs_option_row {
  const char *field;
  const char *env;
  kvs_option_type_t type;
  const char *def;
  uint64_t lo, hi; /* bounds for SIZE (bytes) and INT */
  const char *choices;
  const char *unit;
  const char *help;
  size_t offset;   /* of the value in the block */
} kvs_option_row_t;
typedef struct kvs_option_table {
  const kvs_option_row_t *rows;
  unsigned n;
  size_t size; /* of the block */
} kvs_option_table_t;

/* Core's rows alone, over a kvs_options_t. */
extern const kvs_option_table_t kvs_options_core;

/* Flags for kvs_options_load. */
#define KVS_OPTIONS_APPLY_LOG 1u /* set the log level and KVSHIM_LOG_FILE before warning */

/* Fill the block from an environment block (NULL-terminated "NAME=value" strings; NULL =
 * environ). Defaults first, then each KVSHIM_* entry; XDG_RUNTIME_DIR and the uid give
 * run_dir's default. Every invalid value and every KVSHIM_* name no row of t has is warned
 * about once through the log. Returns the number of problems found (>= 0); the block is always
 * fully usable. kvs_options_load is the same over core's rows (a core-only program). */
int kvs_options_load_rows(const kvs_option_table_t *t, void *block, char *const *envp,
                          unsigned flags);
int kvs_options_load(kvs_options_t *o, char *const *envp, unsigned flags);
/* Defaults only (no environment, no warnings). */
void kvs_options_defaults_rows(const kvs_option_table_t *t, void *block);
void kvs_options_defaults(kvs_options_t *o);

/* Render the resolved table, one line per row: "KVSHIM_POOL_SIZE=1G (default) - help".
 * snprintf semantics: returns the length needed; buf is always NUL-terminated when cap > 0. */
size_t kvs_options_render(const kvs_option_table_t *t, const void *block, char *buf, size_t cap);
/* Render one value canonically ("1G", "on", "shm", "a,c" for FLAGS). */
size_t kvs_options_format_value(const kvs_option_table_t *t, const void *block,
                                kvs_option_id_t id, char *buf, size_t cap);

const char *kvs_options_env_name(const kvs_option_table_t *t, kvs_option_id_t id);
/* A row's command-line flag without its "--": its field with '-' for '_' ("disk-size"). */
const char *kvs_options_flag_name(const kvs_option_table_t *t, kvs_option_id_t id, char *buf,
                                  size_t cap);
/* The variables as `kvshim --help` lists them, one line per row of the table: "  KVSHIM_LEASE_MS
 * (--lease-ms) integer 10..86400000 ms, default 30000: lease deadline backstop". snprintf
 * semantics, as kvs_options_render. */
size_t kvs_options_usage(const kvs_option_table_t *t, char *buf, size_t cap);
/* Parse one value for a row into the block (used by the CLI, whose flags mirror the
 * variables). Returns 0, or -EINVAL/-ERANGE with the block unchanged. */
int kvs_options_set(const kvs_option_table_t *t, void *block, kvs_option_id_t id,
                    const char *value);
/* What is wrong with a value kvs_options_set refused with rc, as the variables' warnings say
 * it: "is out of range [1048576, 1099511627776] bytes", "is not one of none|batch|always". */
const char *kvs_options_describe_bad(const kvs_option_table_t *t, kvs_option_id_t id, int rc,
                                     char *buf, size_t cap);
/* Find a row by variable name ("KVSHIM_POOL_SIZE") or field name ("pool_size"). */
int kvs_options_find(const kvs_option_table_t *t, const char *name, kvs_option_id_t *out);

/* uid == getuid() or listed in KVSHIM_ALLOW_UIDS. */
int kvs_options_uid_allowed(const kvs_options_t *o, uid_t uid);

#ifdef __cplusplus
}
#endif
#endif
