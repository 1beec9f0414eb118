/* kvshim peer client: discovery, the scan of the group directory (peer_discover.h). */
#include "peer_discover.h"

#include <dirent.h>
#include <poll.h>
#include <sys/stat.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "peer_conn.h"
#include "sock.h"

#define DISCOVER_INTERVAL_MS 200
/* File timestamps come from the kernel's coarse clock: a socket created within one of its ticks
 * after the directory last changed leaves the mtime as it was. A scan trusts the mtime it saw
 * only when it is older than this (several ticks); else the next discovery scans again. */
#define DIR_MTIME_SETTLED_NS 50000000ll

/* The mtime to remember for a scan that saw `m`: `m`, or zero (never equal to a real one, so
 * the next discovery rescans) while `m` is too recent to tell a later change from it. */
static struct timespec settled_mtime(struct timespec m) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  long long age = (long long)(now.tv_sec - m.tv_sec) * 1000000000ll + (now.tv_nsec - m.tv_nsec);
  return age > DIR_MTIME_SETTLED_NS ? m : (struct timespec){0, 0};
}

static int parse_sock_name(const char *name, uint64_t *id) {
  if (strlen(name) != 21 || strcmp(name + 16, ".sock") != 0) return -EINVAL;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char ch = name[i];
    unsigned d = ch >= '0' && ch <= '9' ? (unsigned)(ch - '0')
                 : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10) : 16u;
    if (d > 15) return -EINVAL;
    v = v << 4 | d;
  }
  *id = v;
  return 0;
}

/* The peer closed its end (or the fd is no longer valid). poll reads no byte: a reply another
 * thread is waiting for stays where it is. */
static bool hung_up(int fd) {
  struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
  return poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

int kvs_peers_discover(kvs_peers_t *p, bool force) {
  pthread_mutex_lock(&p->discover_lock);
  uint64_t now = kvs__now_ms();
  pthread_mutex_lock(&p->table_lock);
  bool recent = !force && p->last_discover_ms && now - p->last_discover_ms < DISCOVER_INTERVAL_MS;
  pthread_mutex_unlock(&p->table_lock);
  struct stat dst;
  bool dir_known = stat(p->dir, &dst) == 0;
  if (recent && dir_known && (dst.st_mtim.tv_sec != p->dir_mtime.tv_sec ||
                              dst.st_mtim.tv_nsec != p->dir_mtime.tv_nsec))
    recent = false; /* the directory changed since the last scan: a peer came or went */
  bool retry = false;
  if (!recent) {
    /* before the scan: a later change rescans */
    if (dir_known) p->dir_mtime = settled_mtime(dst.st_mtim);
    DIR *d = opendir(p->dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
      uint64_t id;
      if (parse_sock_name(e->d_name, &id) < 0 || id == p->instance_id) continue;
      bool have = false;
      pthread_mutex_lock(&p->table_lock);
      for (pconn_t *c = p->conns; c && !have; c = c->next)
        have = c->info.instance_id == id && c->fd >= 0;
      bool held_off = !have && kvs__peer_penalized(p, id, now, false);
      pthread_mutex_unlock(&p->table_lock);
      if (have) continue;
      char path[4400];
      snprintf(path, sizeof path, "%s/%s", p->dir, e->d_name);
      if (held_off) { /* no HELLO to a peer that failed lately; still notice when it is gone */
        int fd;
        int rc = kvs_sock_connect(path, kvs__now_ns() + 50000000ull, &fd);
        if (rc == -ECONNREFUSED) {
          (void)kvs_sock_remove_stale(path);
        } else if (rc == 0) {
          close(fd);
        }
        continue;
      }
      pconn_t *c = kvs__peer_dial(p, path, id); /* no lock held across the I/O */
      if (!c) {
        /* a peer not answering yet (bound, not listening, or mid-start) that was not penalised:
         * the next discovery dials it again instead of waiting out the interval */
        pthread_mutex_lock(&p->table_lock);
        if (!kvs__peer_penalized(p, id, now, false)) retry = true;
        pthread_mutex_unlock(&p->table_lock);
        continue;
      }
      pthread_mutex_lock(&p->table_lock);
      kvs__peer_penalized(p, id, now, true);
      c->listed = true;
      c->next = p->conns;
      p->conns = c;
      pthread_mutex_unlock(&p->table_lock);
    }
    if (d) closedir(d);
    if (retry) p->dir_mtime = (struct timespec){0, 0};
  }
  /* Forget dead connections (a call failed on them, or, at a scan that listed the directory,
   * the peer hung up: its process ended or its coordinator stopped, seen without waiting for a
   * call to fail on it; a rate-limited call, which the facade makes before its queries, adds no
   * system call per peer); recompute whether a cache peer is there. Adopting it (registering its pool mapping, sizing the own pool) is the
   * caller's event: kvs_peers_pin_cache, from the runtime's watcher (design §3.8). A connection
   * forgotten while a caller holds it is freed by that caller's unref. */
  pconn_t *graveyard = NULL;
  int live = 0;
  pthread_mutex_lock(&p->table_lock);
  p->has_cache = false;
  for (pconn_t **pp = &p->conns; *pp;) {
    pconn_t *c = *pp;
    if (c->fd < 0 || (!recent && hung_up(c->fd))) {
      *pp = c->next;
      c->listed = false;
      if (c->refs == 0) c->next = graveyard, graveyard = c;
      continue;
    }
    live++;
    if (c->info.role == KVS_PROTO_ROLE_CACHE) p->has_cache = true;
    pp = &c->next;
  }
  if (!recent) p->last_discover_ms = now;
  pthread_mutex_unlock(&p->table_lock);
  pthread_mutex_unlock(&p->discover_lock);
  while (graveyard) {
    pconn_t *c = graveyard;
    graveyard = c->next;
    kvs__peer_conn_free(c);
  }
  return live;
}

int kvs_peers_list(kvs_peers_t *p, kvs_peer_info_t *out, size_t cap) {
  int n = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c; c = c->next) {
    if (c->fd < 0) continue;
    if ((size_t)n < cap) out[n] = c->info;
    n++;
  }
  pthread_mutex_unlock(&p->table_lock);
  return n;
}

uint64_t kvs_peers_cache_peer(kvs_peers_t *p) {
  if (!p) return 0;
  uint64_t id = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c && !id; c = c->next)
    if (c->fd >= 0 && c->info.role == KVS_PROTO_ROLE_CACHE) id = c->info.instance_id;
  pthread_mutex_unlock(&p->table_lock);
  return id;
}
