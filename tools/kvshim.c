/* kvshim: the command-line tool.
 *
 *   kvshim serve [--OPTION VALUE ...]   standalone coordinator and pool (a node cache peer)
 *   kvshim peers [--json]               live peers of the group
 *   kvshim stats [PEER] [--json|--prometheus]  counters of one peer (instance id prefix or
 *                                       pid) or all
 *   kvshim put NAME FILE                store a named blob in the group (FILE '-' = stdin)
 *   kvshim get NAME [OUT]               fetch a named blob (OUT '-' or absent = stdout)
 *   kvshim inspect BINARY [--json]      hook families in BINARY and whether LD_PRELOAD reaches them
 *   kvshim remote [--remote URL]        check the remote store (KVSHIM_REMOTE) serve would use
 *   kvshim disk DIR                     check a disk tier directory offline (objects, bytes, bad)
 *   kvshim help [COMMAND]               usage (with every KVSHIM_* variable), or a command's
 *
 * Every KVSHIM_* variable can also be given as a flag: --pool-size 2G is KVSHIM_POOL_SIZE=2G.
 * Exit codes: 0 ok, 1 not found / miss / refused, 2 usage, 3 no peer reachable. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "disk.h"
#include "inspect_cmd.h"
#include "keys.h"
#include "log.h"
#include "options.h"
#include "peer.h"
#include "pool.h"
#include "prim.h"
#include "proto.h"
#include "redis.h"
#include "remote.h"
#include "rows.h"
#include "stats.h"
#include "store.h"
#include <kvshim/kvshim.h>

enum { EXIT_OK = 0, EXIT_MISS = 1, EXIT_USAGE = 2, EXIT_NO_PEER = 3 };

static const char *const usage_text =
    "usage: kvshim COMMAND [ARGS] [--OPTION VALUE ...]\n"
    "\n"
    "commands:\n"
    "  serve               run a standalone node cache (coordinator + pool) until SIGINT/SIGTERM\n"
    "  peers [--json]      list the live peers of the group\n"
    "  stats [PEER] [--json|--prometheus]\n"
    "                      counters of PEER (instance id prefix or pid), or of every peer\n"
    "  put NAME FILE       store FILE ('-' = stdin) under NAME in the group's cache\n"
    "  get NAME [OUT]      fetch NAME into OUT ('-' or absent = stdout)\n"
    "  inspect BINARY [--json]\n"
    "                      hook families in BINARY's libraries and whether LD_PRELOAD can\n"
    "                      interpose them (exit 1: unreadable or not ELF)\n"
    "  remote [--remote URL]\n"
    "                      connect to the remote store (KVSHIM_REMOTE) and describe it\n"
    "  disk DIR            check a disk tier directory (KVSHIM_DISK) offline\n"
    "  help [COMMAND]      this text, or a command's\n"
    "  version             the release (also --version)\n"
    "\n"
    "Every KVSHIM_* variable is also a flag: --pool-size 2G means KVSHIM_POOL_SIZE=2G,\n"
    "--group g means KVSHIM_GROUP=g. Flags win over the environment.\n"
    "exit codes: 0 ok, 1 not found or refused, 2 usage, 3 no peer reachable\n";
/* After usage_text in `kvshim --help` and `kvshim help`: the variables, from the options table. */
static const char *const variables_head = "\nvariables (each also a flag, --NAME VALUE):\n";

static const char *const help_serve =
    "usage: kvshim serve [--pool-size SIZE] [--group NAME] [--run-dir DIR] [--strategy S]\n"
    "                    [--pool-name NAME] [--hugepages 0|1] [--lease-ms MS] [--log LEVEL]\n"
    "                    [--remote URL] [--disk DIR [--disk-size SIZE] [--disk-sync S]]\n"
    "Runs a coordinator and a pool as the group's cache peer: engines push what they commit\n"
    "to it (KVSHIM_PUSH=auto), so cached state outlives the engine that computed it.\n"
    "Prints the socket path, then serves until SIGINT or SIGTERM and stops cleanly.\n"
    "With --remote URL (KVSHIM_REMOTE) it also writes what it holds behind to Redis and fetches\n"
    "what its peers ask for and it lacks from there (README \"Several nodes\").\n"
    "With --disk DIR [--disk-size SIZE] [--disk-sync none|batch|always] (KVSHIM_DISK...) it\n"
    "also writes what it holds behind to DIR and reads what its pool lacks from there, across\n"
    "restarts (README \"A disk tier\"); exit 1 when another serve holds DIR.\n";
static const char *const help_disk =
    "usage: kvshim disk DIR\n"
    "Checks a disk tier directory offline (read only; a running serve may hold it): walks\n"
    "every segment, checks every record's header and payload hash, and prints segments:,\n"
    "objects:, keys:, bytes: and bad:. Exit 0 all good, 1 bad records found, 2 DIR missing or\n"
    "unreadable.\n";
static const char *const help_version =
    "usage: kvshim version (or kvshim --version)\n"
    "Prints the release, \"kvshim MAJOR.MINOR.PATCH\" (KVSHIM_VERSION_STRING of the public\n"
    "header kvshim/kvshim.h).\n";
static const char *const help_peers =
    "usage: kvshim peers [--json]\n"
    "Lists the live peers of the group: instance id, pid, role, strategy, pool size and use.\n"
    "Stale sockets (nobody listening) are removed. Exit 3 when there is no peer.\n";
static const char *const help_stats =
    "usage: kvshim stats [PEER] [--json|--prometheus]\n"
    "Prints the INFO-style counters (or JSON, or the Prometheus text format with labels\n"
    "instance, pid and role) of PEER, given as an instance id prefix or a pid; without PEER, of\n"
    "every live peer. Exit 1 when no live peer matches PEER, 3 when there is no peer.\n";
static const char *const help_remote =
    "usage: kvshim remote [--remote URL] [--remote-password-file FILE] [--remote-timeout-ms MS]\n"
    "Connects to the remote store `kvshim serve` would use and prints its version, mode\n"
    "(standalone or cluster), nodes, slot coverage and round-trip time.\n"
    "Exit 0 reachable and whole, 1 refused (password, not Redis, wrong reply, slots missing),\n"
    "2 no or bad URL, 3 unreachable.\n";
static const char *const help_put =
    "usage: kvshim put NAME FILE\n"
    "Stores FILE ('-' = stdin) under NAME (salted with KVSHIM_SALT) in the cache peer, or in\n"
    "the first live peer. Exit 1 when the peer could not keep it (full, too large).\n";
static const char *const help_get =
    "usage: kvshim get NAME [OUT]\n"
    "Fetches NAME from whichever live peer has it into OUT ('-' or absent = stdout).\n"
    "Exit 1 when no peer has it.\n";

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "kvshim: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(kvshim help for usage)\n");
  return EXIT_USAGE;
}

/* Options from the environment, then --flag VALUE pairs; the other arguments are returned in
 * rest[] (n_rest). Returns 0 or EXIT_USAGE. */
static int parse_args(int argc, char **argv, kvs_config_t *c, char **rest, int *n_rest,
                      int *json) {
  kvs_config_load(c, NULL, KVS_OPTIONS_APPLY_LOG);
  *n_rest = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--json") == 0 || strcmp(a, "--prometheus") == 0) {
      if (!json) return usage_error("%s is not an option of this command", a);
      *json = a[2] == 'j' ? 1 : 2;
      continue;
    }
    if (strcmp(a, "-") == 0 || strncmp(a, "--", 2) != 0) {
      rest[(*n_rest)++] = argv[i];
      continue;
    }
    char field[64];
    const char *name = a + 2, *value = NULL;
    const char *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    if (n >= sizeof field) return usage_error("unknown option %s", a);
    for (size_t k = 0; k < n; k++) field[k] = name[k] == '-' ? '_' : name[k];
    field[n] = '\0';
    kvs_option_id_t id;
    if (kvs_config_find(field, &id) < 0) return usage_error("unknown option %s", a);
    if (eq) value = eq + 1;
    else if (i + 1 < argc) value = argv[++i];
    else return usage_error("option %s needs a value", a);
    int rc = kvs_config_set(c, id, value);
    if (rc < 0) {
      char what[192];
      fprintf(stderr, "kvshim: bad value for --%.*s: '%s' %s\n", (int)n, name, value,
              kvs_options_describe_bad(kvs_config_rows(), id, rc, what, sizeof what));
      return EXIT_USAGE;
    }
    if (id == KVS_OPT_log) kvs_log_set_level((kvs_log_level_t)c->core.log);
  }
  return 0;
}

static const char *role_name(uint8_t r) {
  return r == KVS_PROTO_ROLE_ENGINE ? "engine" : r == KVS_PROTO_ROLE_CACHE ? "cache"
         : r == KVS_PROTO_ROLE_TOOL ? "tool" : "?";
}
static const char *strategy_name(uint8_t s) {
  return s == KVS_PROTO_STRATEGY_SHM ? "shm" : s == KVS_PROTO_STRATEGY_INLINE ? "inline" : "auto";
}

static kvs_peers_t *open_peers(const kvs_options_t *o, int *n_live) {
  kvs_peers_config_t pc = {0};
  pc.opts = o;
  pc.role = KVS_PROTO_ROLE_TOOL;
  kvs_peers_t *p = NULL;
  if (kvs_peers_create(&pc, &p) < 0) return NULL;
  *n_live = kvs_peers_discover(p, true);
  return p;
}

/* open_peers when it sees a live peer; otherwise NULL, after "kvshim CMD: no live peer in
 * RUN_DIR/GROUP" and hint on stderr. */
static kvs_peers_t *live_peers(const kvs_options_t *o, const char *cmd, const char *hint) {
  int live = 0;
  kvs_peers_t *p = open_peers(o, &live);
  if (p && live != 0) return p;
  fprintf(stderr, "kvshim %s: no live peer in %s/%s%s\n", cmd, o->run_dir, o->group, hint);
  kvs_peers_destroy(p);
  return NULL;
}

static kvs_key_t blob_key(const kvs_options_t *o, const char *name) {
  kvs_namespace_t ns;
  memset(&ns, 0, sizeof ns);
  snprintf(ns.engine, sizeof ns.engine, "blob");
  kvs_namespace_set_salt(&ns, o->salt);
  return kvs_keys_name(kvs_keys_namespace(&ns), name, strlen(name));
}

/* ---- serve ------------------------------------------------------------------------------- */

/* serve prefaults its whole pool (design §5), at low priority: it holds the node's copy. */
static void *serve_prefault(void *arg) {
  kvs__prim_thread_background();
  int rc = kvs_pool_prefault(arg);
  if (rc < 0 && rc != -ECANCELED)
    fprintf(stderr, "kvshim serve: pool prefault stopped: %s\n", strerror(-rc));
  return NULL;
}

/* Serve's options that take effect only beside another one: set without it, they are warned
 * about (a user who gave --disk-size alone expects a disk tier). */
static const struct {
  kvs_option_id_t opt, needs;
} serve_needs[] = {
    {KVS_OPT_disk_size, KVS_OPT_disk},
    {KVS_OPT_disk_sync, KVS_OPT_disk},
    {KVS_OPT_remote_password_file, KVS_OPT_remote},
    {KVS_OPT_remote_ttl, KVS_OPT_remote},
    {KVS_OPT_remote_timeout_ms, KVS_OPT_remote},
    {KVS_OPT_remote_threads, KVS_OPT_remote},
    {KVS_OPT_remote_queue, KVS_OPT_remote},
};

static void warn_unused_serve_options(const kvs_options_t *o) {
  const kvs_option_table_t *t = kvs_config_rows();
  for (size_t i = 0; i < sizeof serve_needs / sizeof serve_needs[0]; i++) {
    kvs_option_id_t opt = serve_needs[i].opt, needs = serve_needs[i].needs;
    char value[8]; /* only whether the needed option is empty matters */
    kvs_options_format_value(t, o, needs, value, sizeof value);
    if (o->source[opt] == KVS_OPT_FROM_DEFAULT || value[0]) continue;
    char flag[64], needs_flag[64];
    fprintf(stderr, "kvshim serve: --%s (%s) is ignored without --%s (%s)\n",
            kvs_options_flag_name(t, opt, flag, sizeof flag), kvs_options_env_name(t, opt),
            kvs_options_flag_name(t, needs, needs_flag, sizeof needs_flag),
            kvs_options_env_name(t, needs));
  }
}

static int cmd_serve(kvs_options_t *o) {
  warn_unused_serve_options(o);
  uint64_t id = 0;
  while (id == 0)
    if (getrandom(&id, sizeof id, 0) != sizeof id) id = (uint64_t)getpid() << 32 | (uint64_t)time(NULL);
  kvs_pool_config_t pcfg = {.cache_size = o->pool_size, .host_size = 0,
                            .hugepages = o->hugepages != 0, .instance_id = id,
                            .name = o->pool_name[0] ? o->pool_name : NULL};
  kvs_pool_t *pool = NULL;
  int rc = kvs_pool_create(&pcfg, &pool);
  if (rc < 0) {
    fprintf(stderr, "kvshim serve: cannot create a pool of %" PRIu64 " bytes: %s\n", o->pool_size,
            strerror(-rc));
    return EXIT_MISS;
  }
  kvs_store_config_t scfg = {.pool = pool, .lease_ms = (uint32_t)o->lease_ms};
  kvs_store_t *store = NULL;
  rc = kvs_store_create(&scfg, &store);
  if (rc < 0) {
    fprintf(stderr, "kvshim serve: cannot create the store: %s\n", strerror(-rc));
    kvs_pool_destroy(pool, true);
    return EXIT_MISS;
  }
  /* Block the stop signals before any thread starts, then wait for one. */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  /* The remote tier: any problem with it is one line, and serve goes on without it. */
  kvs_remote_t *remote = NULL;
  if (o->remote[0]) {
    kvs_remote_config_t rcfg = {.opts = o, .store = store, .producer = id};
    char err[512] = "";
    rc = kvs_remote_create(&rcfg, &remote, err, sizeof err);
    if (rc < 0)
      fprintf(stderr, "kvshim serve: remote tier off: %s\n", err[0] ? err : strerror(-rc));
    else if (err[0])
      fprintf(stderr, "kvshim serve: remote tier: %s\n", err);
  }
  /* The disk tier, between the pool and the remote tier: another serve on its directory is
   * refused; any other problem is one line, and serve goes on from memory. */
  kvs_disk_t *disk = NULL;
  if (o->disk[0]) {
    kvs_disk_config_t dcfg = {.opts = o, .store = store,
                              .next = remote ? kvs_remote_hooks(remote) : NULL};
    char err[512] = "";
    rc = kvs_disk_create(&dcfg, &disk, err, sizeof err);
    if (rc == -EBUSY) {
      fprintf(stderr, "kvshim serve: %s\n", err);
      kvs_remote_destroy(remote, 0);
      kvs_store_destroy(store, true);
      kvs_pool_destroy(pool, true);
      return EXIT_MISS;
    }
    if (rc < 0) {
      fprintf(stderr, "kvshim serve: disk tier off: %s\n", err[0] ? err : strerror(-rc));
    } else {
      uint64_t found = 0, ms = 0;
      kvs_disk_scan_result(disk, &found, &ms);
      fprintf(stderr, "kvshim serve: disk tier %s: %" PRIu64 " objects found in %" PRIu64
              " ms%s%s\n", o->disk, found, ms, err[0] ? "; " : "", err);
    }
  }
  const kvs_coord_remote_t *tiers = disk ? kvs_disk_hooks(disk)
                                         : remote ? kvs_remote_hooks(remote) : NULL;
  kvs_coord_config_t ccfg = {.store = store, .pool = pool, .opts = o,
                             .role = KVS_PROTO_ROLE_CACHE, .instance_id = id, .remote = tiers};
  kvs_coord_t *coord = NULL;
  rc = kvs_coord_start(&ccfg, &coord);
  if (rc < 0) {
    fprintf(stderr, "kvshim serve: cannot start the coordinator: %s\n", strerror(-rc));
    kvs_disk_destroy(disk, 0);
    kvs_remote_destroy(remote, 0);
    kvs_store_destroy(store, true);
    kvs_pool_destroy(pool, true);
    return EXIT_MISS;
  }
  pthread_t pf; /* joined before the pool is destroyed (kvs_pool_cancel_prefault) */
  bool prefaulting = pthread_create(&pf, NULL, serve_prefault, pool) == 0;
  char size[32];
  kvs_options_format_value(&kvs_options_core, o, KVS_OPT_pool_size, size, sizeof size);
  kvs_remote_attach(remote, coord);
  kvs_disk_attach(disk, coord);
  printf("kvshim serve: pid %ld, instance %016" PRIx64 ", group %s, pool %s, socket %s%s%s\n",
         (long)getpid(), id, o->group, size, kvs_coord_socket_path(coord),
         disk ? ", disk tier on" : "", remote ? ", remote tier on" : "");
  fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  fprintf(stderr, "kvshim serve: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  kvs_pool_cancel_prefault(pool);
  if (prefaulting) pthread_join(pf, NULL);
  kvs_disk_attach(disk, NULL);
  kvs_remote_attach(remote, NULL);
  kvs_coord_stop(coord);
  /* The disk tier first: its reader hands misses to the remote tier. */
  kvs_disk_destroy(disk, 10000);
  /* What was pushed before the signal is written behind first (bounded). */
  kvs_remote_destroy(remote, (uint32_t)o->remote_timeout_ms * 2 + 3000);
  kvs_store_destroy(store, true);
  kvs_pool_destroy(pool, true);
  return EXIT_OK;
}

/* ---- peers, stats ------------------------------------------------------------------------- */

static int cmd_peers(kvs_options_t *o, int json) {
  int live = 0;
  kvs_peers_t *p = open_peers(o, &live);
  if (!p) return EXIT_NO_PEER;
  kvs_peer_info_t info[256];
  int n = kvs_peers_list(p, info, 256);
  if (n > 256) n = 256;
  if (json) {
    printf("[");
    for (int i = 0; i < n; i++)
      printf("%s{\"instance\":\"%016" PRIx64 "\",\"pid\":%u,\"role\":\"%s\",\"strategy\":\"%s\","
             "\"pool_bytes\":%" PRIu64 ",\"arena_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64
             ",\"socket\":\"%s\"}",
             i ? "," : "", info[i].instance_id, info[i].pid, role_name(info[i].role),
             strategy_name(info[i].strategy), info[i].pool_segment_size, info[i].arena_size,
             info[i].arena_used, info[i].path);
    printf("]\n");
  } else if (n == 0) {
    fprintf(stderr, "kvshim peers: no live peer in %s/%s\n", o->run_dir, o->group);
  } else {
    printf("%-16s %8s %-6s %-8s %12s %12s\n", "INSTANCE", "PID", "ROLE", "STRATEGY", "ARENA", "USED");
    for (int i = 0; i < n; i++)
      printf("%016" PRIx64 " %8u %-6s %-8s %12" PRIu64 " %12" PRIu64 "\n", info[i].instance_id,
             info[i].pid, role_name(info[i].role), strategy_name(info[i].strategy),
             info[i].arena_size, info[i].arena_used);
  }
  kvs_peers_destroy(p);
  return n > 0 ? EXIT_OK : EXIT_NO_PEER;
}

static int matches_peer(const kvs_peer_info_t *pi, const char *sel) {
  char hex[17];
  snprintf(hex, sizeof hex, "%016" PRIx64, pi->instance_id);
  if (strncmp(hex, sel, strlen(sel)) == 0) return 1;
  char *end;
  unsigned long pid = strtoul(sel, &end, 10);
  return *end == '\0' && pid == pi->pid;
}

/* Prometheus text format (version 0.0.4) of the peers' INFO texts: one HELP/TYPE block per
 * field of the stats table, one sample per peer labelled instance, pid and role; counters get
 * the conventional _total suffix. A field a peer did not report (an older peer) has no sample
 * for it. */
typedef struct prom {
  int n;
  kvs_peer_info_t peer[256];
  uint64_t val[256][KVS_STAT__COUNT];
  uint8_t have[256][KVS_STAT__COUNT];
} prom_t;

static void prom_add(prom_t *pr, const kvs_peer_info_t *pi, char *text) {
  int i = pr->n++;
  pr->peer[i] = *pi;
  memset(pr->have[i], 0, sizeof pr->have[i]);
  for (char *line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
    char *colon = strchr(line, ':');
    kvs_stat_id_t id;
    if (line[0] == '#' || !colon) continue;
    *colon = '\0';
    if (kvs_stats_find(line, &id) < 0) continue;
    pr->val[i][id] = strtoull(colon + 1, NULL, 10);
    pr->have[i][id] = 1;
  }
}

static void prom_print(const prom_t *pr) {
  for (int id = 0; id < KVS_STAT__COUNT; id++) {
    bool gauge = kvs_stats_is_gauge((kvs_stat_id_t)id);
    const char *name = kvs_stats_name((kvs_stat_id_t)id), *suffix = gauge ? "" : "_total";
    printf("# HELP kvshim_%s%s %s\n# TYPE kvshim_%s%s %s\n", name, suffix,
           kvs_stats_help((kvs_stat_id_t)id), name, suffix, gauge ? "gauge" : "counter");
    for (int i = 0; i < pr->n; i++)
      if (pr->have[i][id])
        printf("kvshim_%s%s{instance=\"%016" PRIx64 "\",pid=\"%u\",role=\"%s\"} %" PRIu64 "\n",
               name, suffix, pr->peer[i].instance_id, pr->peer[i].pid,
               role_name(pr->peer[i].role), pr->val[i][id]);
  }
}

/* format: 0 INFO text, 1 JSON, 2 Prometheus. */
static int cmd_stats(kvs_options_t *o, const char *sel, int format) {
  kvs_peers_t *p = live_peers(o, "stats", "");
  if (!p) return EXIT_NO_PEER;
  kvs_peer_info_t info[256];
  int n = kvs_peers_list(p, info, 256), shown = 0, rc = EXIT_OK;
  if (n > 256) n = 256;
  static char text[65536];
  static prom_t prom;
  bool json = format == 1;
  prom.n = 0;
  if (json && !sel) printf("[");
  for (int i = 0; i < n; i++) {
    if (sel && !matches_peer(&info[i], sel)) continue;
    int r = kvs_peers_stats(p, info[i].instance_id, json, text, sizeof text);
    if (r < 0) {
      fprintf(stderr, "kvshim stats: peer %016" PRIx64 ": %s\n", info[i].instance_id,
              kvs_proto_strerror(r));
      rc = EXIT_NO_PEER;
      continue;
    }
    if (format == 2) {
      prom_add(&prom, &info[i], text);
    } else if (json) {
      printf("%s%s", shown && !sel ? "," : "", text);
    } else {
      printf("# peer %016" PRIx64 " pid %u (%s)\r\n%s", info[i].instance_id, info[i].pid,
             role_name(info[i].role), text);
    }
    shown++;
  }
  if (json && !sel) printf("]");
  if (json) printf("\n");
  if (format == 2) prom_print(&prom);
  kvs_peers_destroy(p);
  if (sel && shown == 0) {
    fprintf(stderr, "kvshim stats: no live peer matches '%s'\n", sel);
    return EXIT_MISS;
  }
  return rc;
}

/* ---- remote -------------------------------------------------------------------------------- */

static int cmd_remote(kvs_options_t *o) {
  kvs_redis_config_t cfg;
  char pw[256], err[512] = "";
  if (kvs_remote_redis_config(o, &cfg, pw, sizeof pw, err, sizeof err) < 0) {
    fprintf(stderr, "kvshim remote: %s\n", err);
    memset(pw, 0, sizeof pw);
    return EXIT_USAGE;
  }
  kvs_redis_t *r = NULL;
  int rc = kvs_redis_create(&cfg, &r, err, sizeof err);
  memset(pw, 0, sizeof pw);
  if (rc < 0) {
    fprintf(stderr, "kvshim remote: %s\n", err[0] ? err : strerror(-rc));
    return rc == -EACCES || rc == -EPROTO ? EXIT_MISS : rc == -EINVAL ? EXIT_USAGE : EXIT_NO_PEER;
  }
  kvs_redis_info_t info;
  memset(&info, 0, sizeof info);
  rc = kvs_redis_info(r, &info);
  kvs_redis_destroy(r);
  if (rc < 0) {
    fprintf(stderr, "kvshim remote: connected, but the server did not describe itself: %s\n",
            strerror(-rc));
    return rc == -ECONNREFUSED || rc == -ETIMEDOUT || rc == -ECONNRESET ? EXIT_NO_PEER
                                                                       : EXIT_MISS;
  }
  printf("server: redis %s\nmode: %s\nnodes: %d\nslots: %d/16384\nrtt_us: %.1f\n",
         info.version, info.cluster ? "cluster" : "standalone", info.n_nodes,
         info.slots_covered, info.rtt_us);
  if (info.slots_covered < 16384) {
    fprintf(stderr, "kvshim remote: only %d of 16384 slots are served: writes to the others "
            "fail\n", info.slots_covered);
    return EXIT_MISS;
  }
  return EXIT_OK;
}

/* ---- disk --------------------------------------------------------------------------------- */

static int cmd_disk(const char *dir) {
  kvs_disk_report_t rep;
  char err[512] = "";
  int rc = kvs_disk_check(dir, &rep, err, sizeof err);
  if (rc < 0) {
    fprintf(stderr, "kvshim disk: %s\n", err);
    return EXIT_USAGE;
  }
  if (rep.in_use)
    fprintf(stderr, "kvshim disk: %s is in use by kvshim serve (pid %ld): its newest segment "
            "may be growing\n", dir, rep.holder_pid);
  printf("segments: %" PRIu64 "\nobjects: %" PRIu64 "\nkeys: %" PRIu64 "\nbytes: %" PRIu64
         "\nbad: %" PRIu64 "\n", rep.segments, rep.objects, rep.keys, rep.bytes, rep.bad);
  return rep.bad ? EXIT_MISS : EXIT_OK;
}

/* ---- put, get ------------------------------------------------------------------------------ */

static int read_all(const char *path, uint8_t **out, size_t *len) {
  int fd = strcmp(path, "-") == 0 ? 0 : open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (!buf) return -ENOMEM;
    if (n == cap) {
      uint8_t *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        return -ENOMEM;
      }
      buf = nb;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = -errno;
      free(buf);
      if (fd) close(fd);
      return e;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  if (fd) close(fd);
  *out = buf;
  *len = n;
  return 0;
}

static int cmd_put(kvs_options_t *o, const char *name, const char *file) {
  uint8_t *data = NULL;
  size_t len = 0;
  int rc = read_all(file, &data, &len);
  if (rc < 0) {
    fprintf(stderr, "kvshim put: cannot read %s: %s\n", file, strerror(-rc));
    return EXIT_MISS;
  }
  if (len == 0) {
    fprintf(stderr, "kvshim put: %s is empty: nothing to store\n", file);
    free(data);
    return EXIT_MISS;
  }
  kvs_peers_t *p = live_peers(o, "put", " (start one with kvshim serve)");
  if (!p) {
    free(data);
    return EXIT_NO_PEER;
  }
  kvs_key_t key = blob_key(o, name);
  kvs_layout_t layout = kvs_layout_blob(len);
  const void *bufs[1] = {data};
  uint8_t outcome = 0xff;
  rc = kvs_peers_store(p, 0, &key, 1, &layout, true, bufs, &outcome);
  kvs_peers_destroy(p);
  free(data);
  if (rc < 0) {
    fprintf(stderr, "kvshim put: %s\n", kvs_proto_strerror(rc));
    return rc == -ENOENT || rc == -ECONNRESET || rc == -ETIMEDOUT ? EXIT_NO_PEER : EXIT_MISS;
  }
  if (rc == 0) {
    fprintf(stderr, "kvshim put: not stored: %s\n",
            outcome <= KVS_RES_BAD_LAYOUT ? kvs_reserve_outcome_name(outcome) : "unknown");
    return EXIT_MISS;
  }
  fprintf(stderr, "kvshim put: %s: %zu bytes %s\n", name, len,
          outcome == KVS_RES_PRESENT ? "already present" : "stored");
  return EXIT_OK;
}

typedef struct { uint8_t *buf; uint64_t len; } got_t;
static int take_blob(void *ctx, size_t i, const kvs_layout_t *l, const void *bytes, uint64_t len) {
  got_t *g = ctx;
  (void)i, (void)l;
  g->buf = malloc(len ? len : 1);
  if (!g->buf) return -ENOMEM;
  memcpy(g->buf, bytes, len);
  g->len = len;
  return 0;
}

static int cmd_get(kvs_options_t *o, const char *name, const char *out) {
  kvs_peers_t *p = live_peers(o, "get", "");
  if (!p) return EXIT_NO_PEER;
  kvs_key_t key = blob_key(o, name);
  got_t g = {0};
  int rc = kvs_peers_retrieve(p, 0, &key, 1, take_blob, &g);
  kvs_peers_destroy(p);
  if (rc <= 0) {
    fprintf(stderr, "kvshim get: %s: %s\n", name, rc == 0 ? "not found" : kvs_proto_strerror(rc));
    free(g.buf);
    return EXIT_MISS;
  }
  int fd = (!out || strcmp(out, "-") == 0) ? 1 : open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "kvshim get: cannot write %s: %s\n", out, strerror(errno));
    free(g.buf);
    return EXIT_MISS;
  }
  uint64_t off = 0;
  while (off < g.len) {
    ssize_t w = write(fd, g.buf + off, g.len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fprintf(stderr, "kvshim get: write failed: %s\n", strerror(errno));
      free(g.buf);
      return EXIT_MISS;
    }
    off += (uint64_t)w;
  }
  if (fd != 1) close(fd);
  free(g.buf);
  return EXIT_OK;
}

/* The help text of a command handled in this file, or NULL. */
static const char *command_help(const char *cmd) {
  static const struct { const char *name, *help; } table[] = {
      {"serve", help_serve}, {"peers", help_peers}, {"stats", help_stats},
      {"put", help_put},     {"get", help_get},   {"remote", help_remote},
      {"disk", help_disk},   {"version", help_version}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(cmd, table[i].name) == 0) return table[i].help;
  return NULL;
}

/* usage_text and every KVSHIM_* variable (the unknown-variable warning points here). */
static void print_usage(void) {
  char vars[16384];
  size_t n = kvs_config_usage(vars, sizeof vars);
  fputs(usage_text, stdout);
  fputs(variables_head, stdout);
  fputs(vars, stdout);
  if (n >= sizeof vars) fputs("  ...\n", stdout);
}

int main(int argc, char **argv) {
  (void)kvs_stats_use_table(kvs_config_stats()); /* every row: fits, asserted in rows.h */
  if (argc < 2) {
    fputs(usage_text, stderr);
    return EXIT_USAGE;
  }
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    print_usage();
    return EXIT_OK;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
    if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
      fputs(help_version, stdout);
      return EXIT_OK;
    }
    if (argc > 2) return usage_error("%s takes no arguments", argv[1]);
    printf("kvshim %s\n", KVSHIM_VERSION_STRING);
    return EXIT_OK;
  }
  const char *cmd = argv[1];
  const char *help = command_help(cmd);
  if (strcmp(cmd, "help") == 0) {
    const char *sub = argc > 2 ? argv[2] : "";
    const char *h = command_help(sub);
    if (!h && strcmp(sub, "inspect") == 0) h = kvs_inspect_help;
    if (!h && sub[0]) return usage_error("no command '%s' to help with", sub);
    if (h) fputs(h, stdout);
    else print_usage();
    return EXIT_OK;
  }
  if (strcmp(cmd, "inspect") == 0) return kvs_inspect_main(argc - 2, argv + 2);
  if (!help) return usage_error("unknown command '%s'", cmd);
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(help, stdout);
      return EXIT_OK;
    }
  kvs_config_t cfg;
  kvs_options_t *o = &cfg.core; /* what the commands read: core's rows */
  char *rest[64];
  int n_rest = 0, json = 0;
  bool takes_json = strcmp(cmd, "peers") == 0 || strcmp(cmd, "stats") == 0;
  /* rest[] holds at most 64 arguments: checked before any command parses into it. */
  if (argc - 2 > 64) return usage_error("too many arguments%s", "");
  if (strcmp(cmd, "remote") == 0) {
    int r = parse_args(argc - 2, argv + 2, &cfg, rest, &n_rest, NULL);
    if (r) return r;
    if (n_rest) return usage_error("remote takes no argument '%s'", rest[0]);
    return cmd_remote(o);
  }
  if (strcmp(cmd, "disk") == 0) {
    int r = parse_args(argc - 2, argv + 2, &cfg, rest, &n_rest, NULL);
    if (r) return r;
    if (n_rest != 1) return usage_error("disk needs one DIR%s", "");
    return cmd_disk(rest[0]);
  }
  int rc = parse_args(argc - 2, argv + 2, &cfg, rest, &n_rest, takes_json ? &json : NULL);
  if (rc) return rc;
  if (strcmp(cmd, "serve") == 0) {
    if (n_rest) return usage_error("serve takes no argument '%s'", rest[0]);
    return cmd_serve(o);
  }
  if (strcmp(cmd, "peers") == 0) {
    if (n_rest) return usage_error("peers takes no argument '%s'", rest[0]);
    if (json == 2) return usage_error("%s is not an option of peers", "--prometheus");
    return cmd_peers(o, json);
  }
  if (strcmp(cmd, "stats") == 0) {
    if (n_rest > 1) return usage_error("stats takes at most one PEER, got '%s'", rest[1]);
    return cmd_stats(o, n_rest ? rest[0] : NULL, json);
  }
  if (strcmp(cmd, "put") == 0) {
    if (n_rest != 2) return usage_error("put needs NAME and FILE%s", "");
    return cmd_put(o, rest[0], rest[1]);
  }
  if (n_rest < 1 || n_rest > 2) return usage_error("get needs NAME [OUT]%s", "");
  return cmd_get(o, rest[0], n_rest > 1 ? rest[1] : NULL);
}
