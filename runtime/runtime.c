/* runtime: configuration snapshot, lazy runtime init, fork and exit (see runtime.h for the
 * life of the process). */
#include "runtime.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "discovery.h"
#include "hooks.h"
#include "internal.h"
#include "log.h"
#include "prim.h"
#include "proto.h"
#include "resolve.h"

/* ---- process state -------------------------------------------------------------------------- */

kvs__runtime_t kvs__rt;
int kvs__rt_state;
__thread int kvs__hook_depth __attribute__((tls_model("initial-exec")));

static pid_t g_pid;                 /* this process (constructor, then the fork child handler) */
static int g_forked;                /* this image is a fork child of the one that loaded us */

static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;
static kvs_config_t g_opts;         /* written once under g_cfg_once */

static pthread_once_t g_rt_once = PTHREAD_ONCE_INIT;
/* Fork child: the runtime inherited from the parent and never used. Extern (hidden), so the
 * copy made in the fork handler is not optimised away: it keeps those objects reachable. */
kvs__runtime_t kvs__forgotten_rt;
static int g_tried;                 /* this process built (or tried to build) a runtime */
/* This process called a hooked function (it read the configuration or reached the runtime),
 * whether kvshim is enabled or not: it writes KVSHIM_STATS at exit. Unrelated children of the
 * engine (exec'd with the preload but calling no hook) write nothing. */
static int g_hooked;

/* Kept for the fork child, which must close the sockets it inherited from the coordinator
 * (listening + accepted: their local address is the socket path) and from the peer client
 * (their remote address lies in the group directory). Plain char arrays: read from the fork
 * handler. */
static char g_sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char g_group_dir[sizeof(((struct sockaddr_un *)0)->sun_path)];

/* ---- configuration -------------------------------------------------------------------------- */

static void cfg_load(void) {
  KVS__REENTRY_GUARD();
  __atomic_store_n(&g_hooked, 1, __ATOMIC_RELAXED);
  (void)kvs_stats_use_table(kvs_config_stats()); /* fits: asserted in rows.h */
  kvs_config_load(&g_opts, NULL, KVS_OPTIONS_APPLY_LOG);
  if (kvs_log_get_level() >= KVS_LOG_DEBUG) {
    char table[8192];
    kvs_config_render(&g_opts, table, sizeof table);
    kvs_log_debug("configuration (pid %ld):", (long)getpid());
    for (char *line = table, *nl; *line; line = nl + 1) {
      nl = strchr(line, '\n');
      if (nl) *nl = '\0';
      kvs_log_debug("  %s", line);
      if (!nl) break;
    }
  }
  if (!g_opts.enable) {
    int expected = KVS__RT_UNINIT;
    __atomic_compare_exchange_n(&kvs__rt_state, &expected, KVS__RT_DISABLED, false,
                                __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  }
}

const kvs_config_t *kvs__runtime_options(void) {
  pthread_once(&g_cfg_once, cfg_load);
  return &g_opts;
}

/* ---- runtime ---------------------------------------------------------------------------------- */

static void *prefault_main(void *arg) {
  /* Low priority: pre-faulting must not take CPU from the engine (on a small machine a
   * normal-priority prefault of a 1 GiB pool slowed the engine's first requests 2-3x). Pages
   * the engine touches before this thread gets to them are simply faulted by the engine. Nice
   * 19, not SCHED_IDLE (kvs__prim_thread_background says why). */
  kvs__prim_thread_background();
  /* Step-ahead (design §5): only KVS__PREFAULT_AHEAD past the highest extent allocated, so an
   * engine's resident memory follows what it keeps, not KVSHIM_POOL_SIZE. */
  int rc = kvs_pool_prefault_ahead(arg, KVS__PREFAULT_AHEAD);
  if (rc < 0 && rc != -ECANCELED) kvs_log_info("pool prefault stopped: %s", strerror(-rc));
  return NULL;
}

/* Threads kvshim starts must not take the engine's signals: they are created with every
 * signal blocked (the mask is inherited from the creating thread). */
static void block_signals(sigset_t *old) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, old);
}
static void restore_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

static void rt_teardown(kvs__runtime_t *rt) {
  kvs_peers_destroy(rt->peers);
  kvs_coord_stop(rt->coord);
  kvs_tensor_registry_destroy(rt->tensors);
  kvs_store_destroy(rt->store, true);
  kvs_pool_destroy(rt->pool, true);
  memset(rt, 0, sizeof *rt);
}

static int rt_build_parts(kvs__runtime_t *rt, const kvs_config_t *c) {
  memset(rt, 0, sizeof *rt);
  rt->opts = *c;
  const kvs_options_t *o = &c->core;
  rt->pid = g_pid;
  kvs_pool_config_t pc = {.cache_size = o->pool_size, .host_size = c->host_pool_size,
                          .hugepages = o->hugepages != 0};
  int rc = kvs_pool_create(&pc, &rt->pool);
  if (rc < 0) {
    kvs_log_warn("cannot create the pool (%llu + %llu bytes): %s",
                 (unsigned long long)o->pool_size, (unsigned long long)c->host_pool_size,
                 strerror(-rc));
    return rc;
  }
  const kvs_pool_header_t *h = kvs_pool_header(rt->pool);
  rt->instance_id = h->instance_id;
  if (h->host_size) {
    rt->host_off = h->host_off;
    rt->host_lo = (uintptr_t)kvs_pool_base(rt->pool) + h->host_off;
    rt->host_hi = rt->host_lo + h->host_size;
  }
  kvs_store_config_t sc = {.pool = rt->pool, .lease_ms = (uint32_t)o->lease_ms};
  if ((rc = kvs_store_create(&sc, &rt->store)) < 0) {
    kvs_log_warn("cannot create the store: %s", strerror(-rc));
    return rc;
  }
  if ((rc = kvs_tensor_registry_create(0, &rt->tensors)) < 0) {
    kvs_log_warn("cannot create the tensor registry: %s", strerror(-rc));
    return rc;
  }
  if (o->peers) {
    /* EXPORT_TENSORS answers from the registry (core/wire/coord.h's interface, copied) */
    kvs_coord_tensors_t exports = kvs_tensor_registry_coord(rt->tensors);
    kvs_coord_config_t cc = {.store = rt->store, .pool = rt->pool, .opts = o,
                             .role = KVS_PROTO_ROLE_ENGINE, .instance_id = rt->instance_id,
                             .tensors = &exports};
    if ((rc = kvs_coord_start(&cc, &rt->coord)) < 0) {
      kvs_log_warn("cannot start the coordinator in %s: %s", o->run_dir, strerror(-rc));
      return rc;
    }
    kvs_peers_config_t pcfg = {.opts = o, .instance_id = rt->instance_id,
                               .role = KVS_PROTO_ROLE_ENGINE, .local = rt->store};
    if ((rc = kvs_peers_create(&pcfg, &rt->peers)) < 0) {
      kvs_log_warn("cannot create the peer client: %s", strerror(-rc));
      return rc;
    }
  }
  if ((rc = kvs__families_init(rt)) < 0) return rc;
  return 0;
}

static void rt_build(void) {
  KVS__REENTRY_GUARD();
  const kvs_config_t *c = kvs__runtime_options();
  const kvs_options_t *o = &c->core;
  if (!c->enable) return; /* DISABLED was set by cfg_load */
  g_tried = 1;
  sigset_t old;
  block_signals(&old);
  int rc = rt_build_parts(&kvs__rt, c);
  if (rc == 0) {
    if (kvs__rt.coord) {
      int n1 = snprintf(g_sock_path, sizeof g_sock_path, "%s",
                        kvs_coord_socket_path(kvs__rt.coord));
      int n2 = snprintf(g_group_dir, sizeof g_group_dir, "%s/%s/", o->run_dir, o->group);
      if (n1 < 0 || (size_t)n1 >= sizeof g_sock_path) g_sock_path[0] = '\0';
      if (n2 < 0 || (size_t)n2 >= sizeof g_group_dir) g_group_dir[0] = '\0';
    }
    /* Cold start: the first discovery (connect + HELLO to every peer, mapping their pools)
     * runs on the watcher, beside the engine's own start (design §3.8). */
    if (kvs__rt.peers) (void)kvs__discovery_start(&kvs__rt);
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) == 0) {
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      if (kvs__prim_thread_start(&t, &attr, prefault_main, kvs__rt.pool) != 0)
        kvs_log_info("no prefault thread: the pool is backed on first touch");
      pthread_attr_destroy(&attr);
    }
  }
  restore_signals(&old);
  if (rc < 0) {
    rt_teardown(&kvs__rt);
    kvs_log_warn("kvshim is off in this process (%s): every hook passes through",
                 strerror(-rc));
    __atomic_store_n(&kvs__rt_state, KVS__RT_FAILED, __ATOMIC_RELEASE);
  } else {
    kvs_log_info("ready: pool %llu + %llu bytes, instance %016llx%s%s",
                 (unsigned long long)o->pool_size, (unsigned long long)c->host_pool_size,
                 (unsigned long long)kvs__rt.instance_id, kvs__rt.coord ? ", socket " : "",
                 kvs__rt.coord ? kvs_coord_socket_path(kvs__rt.coord) : "");
    __atomic_store_n(&kvs__rt_state, KVS__RT_ACTIVE, __ATOMIC_RELEASE);
  }
}

kvs__runtime_t *kvs__runtime_get(void) {
  if (kvs__unlikely(kvs__hook_depth != 0)) return NULL;
  int s = __atomic_load_n(&kvs__rt_state, __ATOMIC_ACQUIRE);
  if (kvs__likely(s == KVS__RT_ACTIVE)) return &kvs__rt;
  __atomic_store_n(&g_hooked, 1, __ATOMIC_RELAXED);
  if (s == KVS__RT_UNINIT) {
    pthread_once(&g_rt_once, rt_build);
    s = __atomic_load_n(&kvs__rt_state, __ATOMIC_ACQUIRE);
    if (s == KVS__RT_ACTIVE) return &kvs__rt;
  }
  if (s == KVS__RT_FAILED) kvs__hook_fallback();
  return NULL;
}

/* ---- one copy per node (design §3.5) ------------------------------------------------------- */

/* Pool sizing last applied: 1 lean (a cache peer is there), 0 full, -1 not yet. */
static int g_lean = -1;

uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt) {
  uint64_t id = rt->peers ? kvs_peers_cache_peer(rt->peers) : 0;
  /* The own pool is a staging and fallback area while a cache peer holds the node's copy, and
   * the cache itself (up to KVSHIM_POOL_SIZE) when there is none. */
  int lean = id != 0;
  if (__atomic_load_n(&g_lean, __ATOMIC_RELAXED) != lean) {
    __atomic_store_n(&g_lean, lean, __ATOMIC_RELAXED);
    kvs_pool_set_limit(rt->pool, lean ? rt->opts.pool_lean_size : 0);
    kvs_log_debug("pool: %s (%llu bytes usable)", lean ? "a cache peer is in the group: lean"
                                                       : "no cache peer: full size",
                  (unsigned long long)kvs_pool_limit(rt->pool));
  }
  return rt->opts.one_copy ? id : 0;
}

/* ---- keep-behind ------------------------------------------------------------------------ */

/* A ring of chunks to copy from a peer into the local store. Static (untouched, so not
 * resident, until the first keep); guarded by g_keep_lock. */
#define KEEP_CAP 512u
#define KEEP_BATCH 64u
typedef struct keep_item {
  uint64_t instance;
  kvs_key_t key;
  kvs_layout_t layout;
} keep_item_t;

static pthread_mutex_t g_keep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_keep_work = PTHREAD_COND_INITIALIZER; /* items queued, or stop */
static pthread_cond_t g_keep_idle = PTHREAD_COND_INITIALIZER; /* queue empty, thread idle */
static keep_item_t g_keep_q[KEEP_CAP];
static uint32_t g_keep_head, g_keep_len;
static uint32_t g_keep_ready; /* the leading items released (kvs__runtime_keep_release) */
static bool g_keep_busy, g_keep_stop, g_keep_started;
static pthread_t g_keep_thread;
static pid_t g_keep_tid; /* the thread's id for kvs__prim_thread_set_nice; 0: not yet known */
static int g_keep_exit_prio = 20; /* the exit wait's nice value for the thread; 20: none yet */

/* Under g_keep_lock, once both the thread's id and the exit wait's priority are known. */
static void keep_lift(void) {
  if (!g_keep_tid || g_keep_exit_prio >= 19) return;
  int rc = kvs__prim_thread_set_nice(g_keep_tid, g_keep_exit_prio);
  if (rc < 0) kvs_log_debug("keep-behind: stays at nice 19 for the exit wait: %s", strerror(-rc));
}
/* The keep-behind thread's own peer client (its own connections): a retrieve holds its
 * connection's lock while it copies, so sharing rt->peers would make the engine's next load
 * wait behind a nice-19 copy (measured: +6..12 ms over 16 cold loads). */
static kvs_peers_t *g_keep_peers; /* written under g_keep_lock */
/* Fork child: the parent's keep-behind client, kept reachable as kvs__forgotten_rt is. */
kvs_peers_t *kvs__forgotten_keep_peers;

static kvs_peers_t *keep_peers_create(const kvs__runtime_t *rt) {
  kvs_options_t o = rt->opts.core;
  o.push = KVS_PUSH_OFF; /* it only fetches */
  kvs_peers_config_t pc = {.opts = &o, .instance_id = rt->instance_id,
                           .role = KVS_PROTO_ROLE_ENGINE, .local = rt->store};
  kvs_peers_t *p = NULL;
  if (kvs_peers_create(&pc, &p) < 0) return NULL;
  return p;
}

static void *keep_main(void *arg) {
  kvs__runtime_t *rt = arg;
  KVS__REENTRY_GUARD(); /* hooks reached from here pass through */
  /* Nice 19, not SCHED_IDLE: the copies yield to the engine's threads but still run on a busy
   * machine, so a later request finds them local. */
  pid_t tid = kvs__prim_thread_id();
  kvs__prim_thread_background();
  kvs_key_t keys[KEEP_BATCH];
  kvs_fetch_t fetched[KEEP_BATCH];
  kvs_peers_t *peers = keep_peers_create(rt);
  if (!peers) kvs_log_info("keep-behind: no peer client of its own: sharing the engine's");
  pthread_mutex_lock(&g_keep_lock);
  g_keep_peers = peers; /* destroyed by keep_stop, after the join */
  g_keep_tid = tid;
  keep_lift(); /* keep_stop came first */
  for (;;) {
    while (!g_keep_ready && !g_keep_stop) pthread_cond_wait(&g_keep_work, &g_keep_lock);
    if (g_keep_stop) break;
    /* The leading items of one peer and one layout: one retrieve. */
    const keep_item_t *first = &g_keep_q[g_keep_head];
    uint64_t instance = first->instance;
    kvs_layout_t layout = first->layout;
    size_t n = 0;
    while (n < KEEP_BATCH && n < g_keep_ready) {
      const keep_item_t *it = &g_keep_q[(g_keep_head + n) % KEEP_CAP];
      if (it->instance != instance || memcmp(&it->layout, &layout, sizeof layout) != 0) break;
      keys[n++] = it->key;
    }
    g_keep_head = (g_keep_head + (uint32_t)n) % KEEP_CAP;
    g_keep_len -= (uint32_t)n;
    g_keep_ready -= (uint32_t)n;
    g_keep_busy = true;
    pthread_mutex_unlock(&g_keep_lock);
    (void)kvs__discovery_scan(peers); /* its own client dials the peer (rate-limited) */
    int rc = kvs_peers_fetch(peers ? peers : rt->peers, instance, keys, n, &layout, NULL, NULL,
                             fetched);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
      if (fetched[i].status != KVS_FETCH_COPIED) continue;
      kept += kvs_store_commit(rt->store, KVS_OWNER_LOCAL, fetched[i].xfer) == 0;
    }
    if (kept < n)
      kvs_log_debug("keep-behind: %zu of %zu chunks kept from %016llx (%s)", kept, n,
                    (unsigned long long)instance, rc < 0 ? strerror(-rc) : "ok");
    pthread_mutex_lock(&g_keep_lock);
    g_keep_busy = false;
    if (!g_keep_len) pthread_cond_broadcast(&g_keep_idle);
  }
  g_keep_busy = false;
  pthread_cond_broadcast(&g_keep_idle);
  pthread_mutex_unlock(&g_keep_lock);
  return NULL;
}

int kvs__runtime_keep(kvs__runtime_t *rt, uint64_t instance, const kvs_key_t *keys, size_t n,
                      const kvs_layout_t *layout, bool release) {
  if (!rt || !keys || !layout || n == 0 || !instance) return -EINVAL;
  if (!rt->peers) return -ENOTSUP;
  int rc = 0;
  pthread_mutex_lock(&g_keep_lock);
  if (g_keep_stop) {
    rc = -ENOTSUP; /* exiting */
  } else if (g_keep_len + n > KEEP_CAP) {
    rc = -ENOSPC;
  } else if (!g_keep_started) {
    g_keep_started = kvs__prim_thread_start(&g_keep_thread, NULL, keep_main, rt) == 0;
    if (!g_keep_started) rc = -EAGAIN;
  }
  if (rc == 0) {
    for (size_t i = 0; i < n; i++) {
      keep_item_t *it = &g_keep_q[(g_keep_head + g_keep_len++) % KEEP_CAP];
      it->instance = instance;
      it->key = keys[i];
      it->layout = *layout;
    }
    if (release) {
      g_keep_ready = g_keep_len;
      pthread_cond_signal(&g_keep_work);
    }
  }
  pthread_mutex_unlock(&g_keep_lock);
  if (rc < 0) kvs_log_debug("keep-behind: %zu chunks not queued: %s", n, strerror(-rc));
  return rc;
}

void kvs__runtime_keep_release(void) {
  pthread_mutex_lock(&g_keep_lock);
  if (g_keep_ready != g_keep_len) {
    g_keep_ready = g_keep_len;
    pthread_cond_signal(&g_keep_work);
  }
  pthread_mutex_unlock(&g_keep_lock);
}

/* Release and wait (up to timeout_ms) for the queued keeps, then stop and join the thread.
 * What is left is not kept. */
static void keep_stop(uint32_t timeout_ms) {
  pthread_mutex_lock(&g_keep_lock);
  g_keep_ready = g_keep_len;
  pthread_cond_signal(&g_keep_work);
  if (!g_keep_started) {
    g_keep_stop = true;
    pthread_mutex_unlock(&g_keep_lock);
    return;
  }
  /* At exit the keeps no longer compete with requests, and at nice 19 a loaded machine may
   * give the thread so little CPU (weight 15 against 1024 per nice-0 thread) that it misses
   * the deadline. Lift it to the exiting thread's priority; without the privilege to lower a
   * nice value (CAP_SYS_NICE or RLIMIT_NICE) it stays at 19 and the wait is as before. */
  int prio;
  if (kvs__prim_thread_get_nice(&prio) == 0) g_keep_exit_prio = prio;
  keep_lift();
  struct timespec until = kvs__realtime_after_ms(timeout_ms);
  while ((g_keep_len || g_keep_busy) &&
         pthread_cond_timedwait(&g_keep_idle, &g_keep_lock, &until) == 0) {
  }
  if (g_keep_len) kvs_log_info("keep-behind: %u chunks not kept at exit", g_keep_len);
  g_keep_len = g_keep_ready = 0;
  g_keep_stop = true;
  pthread_cond_broadcast(&g_keep_work);
  pthread_mutex_unlock(&g_keep_lock);
  pthread_join(g_keep_thread, NULL); /* a retrieve in progress ends by its RPC deadline */
  g_keep_started = false;
  g_keep_tid = 0;
  g_keep_exit_prio = 20;
  kvs_peers_destroy(g_keep_peers);
  g_keep_peers = NULL;
}

/* Fork child: the parent's thread is not ours, and its lock may have been held at the fork. */
static void keep_fork_child(void) {
  pthread_mutex_init(&g_keep_lock, NULL);
  pthread_cond_init(&g_keep_work, NULL);
  pthread_cond_init(&g_keep_idle, NULL);
  g_keep_head = g_keep_len = g_keep_ready = 0;
  g_keep_busy = g_keep_stop = g_keep_started = false;
  g_keep_tid = 0;
  g_keep_exit_prio = 20;
  kvs__forgotten_keep_peers = g_keep_peers; /* the parent's, forgotten with its runtime */
  g_keep_peers = NULL;
}

/* ---- exit ------------------------------------------------------------------------------------ */

/* KVSHIM_STATS with "%p" replaced by the pid; a fork child without "%p" in the path writes
 * "<path>.<pid>" so it never replaces its parent's file. */
static int stats_path(const char *tmpl, char *out, size_t cap) {
  size_t n = 0;
  bool had_pid = false;
  for (const char *s = tmpl; *s; s++) {
    int w;
    if (s[0] == '%' && s[1] == 'p') {
      w = snprintf(out + n, cap - n, "%ld", (long)g_pid);
      s++;
      had_pid = true;
    } else {
      w = snprintf(out + n, cap - n, "%c", *s);
    }
    if (w < 0 || (size_t)w >= cap - n) return -ENAMETOOLONG;
    n += (size_t)w;
  }
  if (g_forked && !had_pid) {
    int w = snprintf(out + n, cap - n, ".%ld", (long)g_pid);
    if (w < 0 || (size_t)w >= cap - n) return -ENAMETOOLONG;
  }
  return 0;
}

void kvs__runtime_exit(void) {
  if (!g_tried && !__atomic_load_n(&g_hooked, __ATOMIC_RELAXED)) return;
  /* Hooks called by what follows (and by later destructors) pass through. */
  KVS__REENTRY_GUARD();
  kvs_stats_t *st = kvs_stats_global();
  kvs__discovery_stop(); /* before the peer client it refreshes is destroyed */
  /* Keep-behind (bounded), so the stats count what was kept. */
  keep_stop(2000);
  /* Write-behind (bounded), so the stats count what reached the cache peer. */
  if (kvs__rt.peers) kvs_peers_flush(kvs__rt.peers, 2000);
  /* The store's gauges after both, so they include what keep-behind kept. */
  if (__atomic_load_n(&kvs__rt_state, __ATOMIC_ACQUIRE) == KVS__RT_ACTIVE) {
    char scratch[16];
    kvs_coord_render_stats(kvs__rt.store, st, 1, scratch, sizeof scratch); /* gauges only */
  }
  if (g_opts.stats[0]) {
    char path[KVS_OPT_STR_MAX + 32];
    int rc = stats_path(g_opts.stats, path, sizeof path);
    if (rc == 0)
      rc = kvs_stats_write_json_extra(
          st, g_opts.enable ? "\"enabled\":true" : "\"enabled\":false", path);
    if (rc < 0) kvs_log_warn("cannot write stats to %s: %s", g_opts.stats, strerror(-rc));
  }
  /* Stop serving (the socket file goes away); pool and store stay for late hooks. */
  kvs_peers_t *peers = kvs__rt.peers;
  kvs_coord_t *coord = kvs__rt.coord;
  kvs__rt.peers = NULL;
  kvs__rt.coord = NULL;
  kvs_peers_destroy(peers);
  kvs_coord_stop(coord);
}

/* ---- fork --------------------------------------------------------------------------------- */

static bool str_starts(const char *s, size_t n, const char *prefix) {
  size_t k = strlen(prefix);
  return k > 0 && n >= k && memcmp(s, prefix, k) == 0;
}

/* Close the sockets inherited from the parent's coordinator and peer client, so the parent's
 * listening socket and connections do not outlive it in this child. Async-signal-safe: raw
 * getdents64 over /proc/self/fd, getsockname/getpeername, close. */
static void close_inherited_sockets(void) {
  if (!g_sock_path[0]) return;
  int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  char buf[4096];
  for (;;) {
    long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
    if (n <= 0) break;
    for (long pos = 0; pos < n;) {
      struct {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[];
      } *de = (void *)(buf + pos);
      pos += de->reclen;
      int fd = 0;
      const char *c = de->name;
      if (*c < '0' || *c > '9') continue;
      for (; *c >= '0' && *c <= '9'; c++) fd = fd * 10 + (*c - '0');
      if (fd == dfd) continue;
      struct sockaddr_un a;
      socklen_t len = sizeof a;
      memset(&a, 0, sizeof a);
      if (getsockname(fd, (struct sockaddr *)&a, &len) != 0 || a.sun_family != AF_UNIX) continue;
      size_t plen = len > offsetof(struct sockaddr_un, sun_path)
                        ? strnlen(a.sun_path, len - offsetof(struct sockaddr_un, sun_path))
                        : 0;
      bool ours = plen == strlen(g_sock_path) && memcmp(a.sun_path, g_sock_path, plen) == 0;
      if (!ours) {
        len = sizeof a;
        memset(&a, 0, sizeof a);
        if (getpeername(fd, (struct sockaddr *)&a, &len) == 0 && a.sun_family == AF_UNIX) {
          plen = len > offsetof(struct sockaddr_un, sun_path)
                     ? strnlen(a.sun_path, len - offsetof(struct sockaddr_un, sun_path))
                     : 0;
          ours = str_starts(a.sun_path, plen, g_group_dir);
        }
      }
      if (ours) close(fd);
    }
  }
  close(dfd);
}

void kvs__runtime_fork(int phase) {
  kvs__resolve_atfork(phase);
  if (phase != 2) return;
  g_pid = (pid_t)syscall(SYS_getpid);
  g_forked = 1;
  close_inherited_sockets();
  g_sock_path[0] = '\0';
  g_group_dir[0] = '\0';
  /* Forget the parent's runtime: its pool stays mapped (buffers it handed out stay valid here)
   * but this process never allocates from it; the first hooked call builds our own. */
  if (__atomic_load_n(&kvs__rt_state, __ATOMIC_RELAXED) != KVS__RT_DISABLED)
    __atomic_store_n(&kvs__rt_state, KVS__RT_UNINIT, __ATOMIC_RELAXED);
  kvs__forgotten_rt = kvs__rt; /* its objects stay reachable: forgotten on purpose, not leaked */
  memset(&kvs__rt, 0, sizeof kvs__rt);
  g_rt_once = (pthread_once_t)PTHREAD_ONCE_INIT;
  g_tried = 0;
  g_hooked = 0;
  kvs__discovery_fork_child(); /* the parent's watcher is not ours */
  keep_fork_child();
  g_lean = -1;
  kvs_stats_init(kvs_stats_global());
  kvs__families_fork_child();
}

void kvs__runtime_loaded(void) { g_pid = getpid(); }
