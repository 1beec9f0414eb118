/* kvshim disk: see disk.h (the tier) and disk_format.h (the records). */
#include "disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "disk_format.h"
#include "internal.h"
#include "log.h"
#include "prim.h"

#define SEG_MAX_TARGET (256ull << 20) /* a segment is closed once it holds this much */
#define SEG_MIN_TARGET (1ull << 20)
#define WRITE_QUEUE_MAX 4096u          /* queued write-behind objects */
#define BATCH_SYNC_BYTES (64ull << 20) /* --disk-sync batch: fdatasync at least this often */
#define BACKOFF_MIN_MS 1000u           /* writes paused after a fault, doubling */
#define BACKOFF_MAX_MS 30000u
#define HEAD_READ 4096u                /* first read of a record: header and a few aliases */
#define PRIMARY_BIT (1ull << 63)       /* entry_t.off: the key is the record's primary */
#define INDEX_MIN_CAP (1u << 16)
#define DIO_ALIGN 4096u                /* our O_DIRECT buffers' alignment (>= any block size) */

/* One segment file. fd stays open while the segment lives (readers pread it, the writer
 * appends to the active one); a deleted segment's fds are closed by its last reader. dfd is the
 * same file opened with O_DIRECT (-1 when the file system refuses it): version 2 payloads move
 * between the device and a pool extent through it, with no page-cache copy (design §18). */
typedef struct seg {
  uint64_t id;
  int fd, dfd;
  uint64_t size;    /* bytes of good records: the append point of the active segment */
  uint64_t records; /* records written or found in it */
  unsigned refs;    /* readers using fd now */
  bool dead;        /* unlinked: close when refs drops to 0 */
} seg_t;

/* Index entry: key -> record (segment id, offset | PRIMARY_BIT). seg == 0: an empty slot
 * (segment ids start at 1). */
typedef struct entry {
  kvs_key_t key;
  uint64_t seg;
  uint64_t off;
} entry_t;

/* How one thread's large payload transfers went, per method (0 O_DIRECT, 1 buffered): the
 * moving average of ns per MiB (0: none yet), and the transfers so far (kvs_disk_pick_direct). */
typedef struct measured {
  uint64_t ns_mib[2];
  uint32_t n;
} measured_t;

typedef struct job {
  struct job *next;
  kvs_xfer_t xfer;      /* write: the read pin on the object */
  uint64_t bytes;       /* write: the object's length (counted in pinned_bytes) */
  uint64_t token;       /* fetch */
  uint64_t deadline_ms; /* fetch (kvs__now_ms clock) */
  uint32_t found, n;    /* write: keys[0] primary, keys[1..n) aliases; fetch: keys[found..n) */
  kvs_key_t keys[];
} job_t;

/* Fault kinds a write can meet: each is logged once (then only counted). */
#define DISK_FAULTS(X)                                                                        \
  X(NOSPACE, "the file system is full")                                                       \
  X(NOINODES, "the file system has no free inodes")                                           \
  X(IO, "an I/O error")                                                                       \
  X(READONLY, "the directory is read-only or not writable")                                   \
  X(MISSING, "the directory is gone")                                                         \
  X(QUOTA, "the disk quota is exhausted")                                                     \
  X(TOOBIG, "the file size limit was reached")                                                \
  X(OTHER, "an unexpected error")
typedef enum {
#define DISK_FAULT_ENUM(name, text) FAULT_##name,
  DISK_FAULTS(DISK_FAULT_ENUM)
#undef DISK_FAULT_ENUM
} fault_t;
static const char *const fault_text[] = {
#define DISK_FAULT_TEXT(name, text) text,
    DISK_FAULTS(DISK_FAULT_TEXT)
#undef DISK_FAULT_TEXT
};

struct kvs_disk {
  kvs_store_t *store;
  kvs_stats_t *stats;
  kvs_owner_t owner;        /* pins of queued writes, reservations of reads */
  kvs_coord_remote_t hooks; /* ours */
  kvs_coord_remote_t next;  /* the tier below; has_next */
  bool has_next;
  char dir[KVS_OPT_STR_MAX];
  int dir_fd, lock_fd;
  uint64_t size_limit, seg_target;
  int sync;                 /* kvs_disk_sync_t */
  bool writable;
  /* O_DIRECT for version 2 payloads: cleared for good by the first EINVAL (a file system or
   * device whose alignment is above KVS_DISK_ALIGN), then every transfer is buffered. */
  _Atomic bool direct;
  /* Reader thread only: how its large payload reads went (kvs_disk_pick_direct). */
  measured_t reads;
  /* Index and segments: guarded by lock (never held during a payload read or write). */
  pthread_mutex_t lock;
  entry_t *tab;
  size_t cap, used;         /* used: occupied slots; cap a power of two, used <= cap / 2 */
  uint64_t objects;         /* entries with PRIMARY_BIT */
  seg_t **segs;             /* ascending ids; the last one is the active one when active */
  size_t n_segs, segs_cap;
  bool active;
  uint64_t bytes;           /* sum of segs[i]->size */
  /* Queues: guarded by qlock. */
  pthread_mutex_t qlock;
  pthread_cond_t wcond, rcond, idle;
  job_t *w_head, *w_tail, *r_head, *r_tail;
  uint32_t n_writes;
  uint64_t pinned_bytes, pinned_cap;
  unsigned busy;
  bool stop;
  uint64_t paused_until_ms; /* writes dropped until then (a fault's back-off) */
  kvs_coord_t *coord;
  /* Writer thread only. */
  uint64_t next_seq, unsynced;
  /* How its large payload writes went, the fdatasync that makes a buffered one durable
   * included (kvs_disk_pick_direct, as for reads). Buffered writes under --disk-sync batch
   * wait in pend_* (their ns, their bytes) for the sync that completes their cost. */
  measured_t writes;
  uint64_t pend_ns, pend_bytes;
  uint32_t backoff_ms;
  unsigned logged;          /* bit per fault_t already logged */
  bool faulted;
  pthread_t writer, reader;
  bool writer_on, reader_on;
  uint64_t scan_ms, scan_objects;
};

/* ---- I/O helpers --------------------------------------------------------------------------- */

bool kvs_disk_pick_direct(uint64_t direct_ns_mib, uint64_t buffered_ns_mib, uint32_t n) {
  if (!direct_ns_mib) return true;
  if (!buffered_ns_mib) return false;
  bool faster = direct_ns_mib <= buffered_ns_mib;
  uint64_t spread = faster ? buffered_ns_mib / direct_ns_mib : direct_ns_mib / buffered_ns_mib;
  if (spread < 1) spread = 1;
  if (spread > KVS_DISK_PROBE_SPREAD) spread = KVS_DISK_PROBE_SPREAD;
  uint32_t period = KVS_DISK_PROBE_EVERY * (uint32_t)spread;
  return n % period == period - 1 ? !faster : faster;
}

static int pread_all(int fd, void *buf, size_t len, uint64_t off) {
  uint8_t *p = buf;
  while (len) {
    ssize_t r = pread(fd, p, len, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -EIO; /* the file is shorter than its index says */
    p += r, len -= (size_t)r, off += (uint64_t)r;
  }
  return 0;
}

/* Read len bytes at off (a multiple of KVS_DISK_ALIGN) through a segment's O_DIRECT fd: the
 * whole blocks straight into dst (aligned to KVS_DISK_ALIGN), the last partial block through
 * bounce (KVS_DISK_ALIGN bytes, aligned), so nothing past dst + len is written. The file holds
 * the whole last block (records are padded to KVS_DISK_ALIGN). 0 or a negative errno (-EINVAL:
 * the file system wants a larger alignment). */
static int pread_direct(int dfd, uint8_t *dst, size_t len, uint64_t off, uint8_t *bounce) {
  size_t body = len & ~(size_t)(KVS_DISK_ALIGN - 1), tail = len - body;
  while (body) { /* a short direct read ends at a block boundary: go on from there */
    ssize_t r = pread(dfd, dst, body, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0 || r % KVS_DISK_ALIGN) return -EIO;
    dst += r, body -= (size_t)r, off += (uint64_t)r;
  }
  if (tail) {
    ssize_t r;
    while ((r = pread(dfd, bounce, KVS_DISK_ALIGN, (off_t)off)) < 0 && errno == EINTR) {
    }
    if (r < 0) return -errno;
    if ((size_t)r < tail) return -EIO;
    memcpy(dst, bounce, tail);
  }
  return 0;
}

static int pwritev_all(int fd, struct iovec *iov, int n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwritev(fd, iov, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    if (w == 0) return -EIO;
    off += (uint64_t)w;
    while (n > 0 && (size_t)w >= iov->iov_len) w -= (ssize_t)iov->iov_len, iov++, n--;
    if (n > 0) iov->iov_base = (uint8_t *)iov->iov_base + w, iov->iov_len -= (size_t)w;
  }
  return 0;
}

/* A large transfer by a method (direct or buffered) took ns for bytes: into that method's
 * moving average (kvs_disk_pick_direct). */
static void method_measured(measured_t *m, bool direct, uint64_t ns, uint64_t bytes) {
  uint64_t ns_mib = ns * (1ull << 20) / bytes + 1;
  uint64_t *a = &m->ns_mib[direct ? 0 : 1];
  *a = *a ? (*a * 3 + ns_mib) / 4 : ns_mib;
}

/* One debug line at exit: what the method choice of `what` (reads, writes) was based on. */
static void measured_log(const char *what, const measured_t *m) {
  if (m->n)
    kvs_log_debug("disk tier: %u large %s; ns per MiB: O_DIRECT %" PRIu64 ", buffered %" PRIu64,
                  m->n, what, m->ns_mib[0], m->ns_mib[1]);
}

/* The payload of a version 2 record (len bytes at off, dst aligned) by the method measured
 * faster (kvs_disk_pick_direct): O_DIRECT through dfd, or buffered through fd, its page-cache
 * pages then dropped (the pool holds the copy). A large read is timed into the method's
 * average and counted. 0 or a negative errno (-EINVAL from O_DIRECT: the caller turns it off
 * and reads buffered). */
static int read_payload(kvs_disk_t *d, const seg_t *s, uint8_t *dst, size_t len, uint64_t off,
                        uint8_t *bounce) {
  bool large = len >= KVS_DISK_MEASURED;
  bool direct = !large || kvs_disk_pick_direct(d->reads.ns_mib[0], d->reads.ns_mib[1],
                                               d->reads.n);
  uint64_t t0 = kvs__now_ns();
  /* buffered: the device reads ahead into the next record while this one is copied (a prefix's
   * chunks lie in write order), as for version 1 records */
  if (!direct) posix_fadvise(s->fd, (off_t)off, (off_t)(2 * len), POSIX_FADV_WILLNEED);
  int rc = direct ? pread_direct(s->dfd, dst, len, off, bounce) : pread_all(s->fd, dst, len, off);
  if (rc == 0 && !direct) posix_fadvise(s->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
  if (rc == 0 && large) {
    method_measured(&d->reads, direct, kvs__now_ns() - t0, len);
    d->reads.n++;
    kvs_stats_inc(d->stats, direct ? KVS_STAT_disk_reads_direct : KVS_STAT_disk_reads_buffered);
  }
  return rc;
}

/* The segment's O_DIRECT descriptor, or -1 (direct I/O off, or refused by the file system). */
static int open_direct(kvs_disk_t *d, const char *name) {
  if (!atomic_load(&d->direct)) return -1;
  return openat(d->dir_fd, name, (d->writable ? O_RDWR : O_RDONLY) | O_DIRECT | O_CLOEXEC);
}

static void seg_close(seg_t *s) {
  close(s->fd);
  if (s->dfd >= 0) close(s->dfd);
  free(s);
}

/* A direct transfer was refused for its alignment: every later one is buffered. */
static void direct_off(kvs_disk_t *d) {
  if (atomic_exchange(&d->direct, false))
    kvs_log_warn("disk tier: %s refuses O_DIRECT at %u-byte alignment: buffered I/O from now on",
                 d->dir, KVS_DISK_ALIGN);
}

static int fd_read_at(void *ctx, void *buf, size_t len, uint64_t off) {
  return pread_all(*(int *)ctx, buf, len, off);
}

/* ---- index (lock held) --------------------------------------------------------------------- */

static size_t slot_of(const kvs_disk_t *d, kvs_key_t k) {
  return (size_t)((k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)) & (d->cap - 1));
}

static entry_t *idx_find(kvs_disk_t *d, kvs_key_t k) {
  for (size_t i = slot_of(d, k);; i = (i + 1) & (d->cap - 1)) {
    entry_t *e = &d->tab[i];
    if (e->seg == 0) return NULL;
    if (kvs_key_eq(e->key, k)) return e;
  }
}

static int idx_resize(kvs_disk_t *d, size_t cap);

/* Bind key to a record (replacing what it named). */
static int idx_put(kvs_disk_t *d, kvs_key_t k, uint64_t seg, uint64_t off, bool primary) {
  if ((d->used + 1) * 2 > d->cap) KVS_TRY(idx_resize(d, d->cap * 2));
  size_t i = slot_of(d, k);
  while (d->tab[i].seg != 0 && !kvs_key_eq(d->tab[i].key, k)) i = (i + 1) & (d->cap - 1);
  entry_t *e = &d->tab[i];
  if (e->seg == 0) d->used++;
  else if (e->off & PRIMARY_BIT) d->objects--;
  *e = (entry_t){k, seg, off | (primary ? PRIMARY_BIT : 0)};
  if (primary) d->objects++;
  return 0;
}

static int idx_resize(kvs_disk_t *d, size_t cap) {
  entry_t *old = d->tab;
  size_t old_cap = d->cap;
  entry_t *tab = calloc(cap, sizeof *tab);
  if (!tab) return -ENOMEM;
  d->tab = tab, d->cap = cap, d->used = 0, d->objects = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].seg) idx_put(d, old[i].key, old[i].seg, old[i].off & ~PRIMARY_BIT,
                            (old[i].off & PRIMARY_BIT) != 0);
  free(old);
  return 0;
}

/* Remove key if it names the record (seg, off) (linear probing: backward-shift deletion). */
static void idx_del(kvs_disk_t *d, kvs_key_t k, uint64_t seg, uint64_t off) {
  entry_t *e = idx_find(d, k);
  if (!e || e->seg != seg || (e->off & ~PRIMARY_BIT) != off) return;
  if (e->off & PRIMARY_BIT) d->objects--;
  size_t i = (size_t)(e - d->tab), mask = d->cap - 1;
  for (size_t j = (i + 1) & mask; d->tab[j].seg; j = (j + 1) & mask) {
    size_t home = slot_of(d, d->tab[j].key);
    /* move j back to i when its home is not in (i, j] (cyclically) */
    bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      d->tab[i] = d->tab[j];
      i = j;
    }
  }
  d->tab[i].seg = 0;
  d->used--;
}

/* Drop every entry of a segment (a bulk delete: one pass over the table). */
static void idx_drop_seg(kvs_disk_t *d, uint64_t seg) {
  size_t w = 0;
  for (size_t i = 0; i < d->cap; i++)
    if (d->tab[i].seg && d->tab[i].seg != seg) d->tab[w++] = d->tab[i];
  size_t n = w;
  /* Re-insert the survivors from the front of the table (they are packed at [0, n)). */
  entry_t *keep = malloc((n ? n : 1) * sizeof *keep);
  if (keep) {
    memcpy(keep, d->tab, n * sizeof *keep);
    memset(d->tab, 0, d->cap * sizeof *d->tab);
    d->used = 0, d->objects = 0;
    for (size_t i = 0; i < n; i++)
      idx_put(d, keep[i].key, keep[i].seg, keep[i].off & ~PRIMARY_BIT,
              (keep[i].off & PRIMARY_BIT) != 0);
    free(keep);
    return;
  }
  /* No memory for the copy: empty the whole index (a miss costs a recompute, never a wrong
   * byte). */
  memset(d->tab, 0, d->cap * sizeof *d->tab);
  d->used = 0, d->objects = 0;
}

static void gauges(kvs_disk_t *d) {
  kvs_stats_set(d->stats, KVS_STAT_disk_objects, d->objects);
  kvs_stats_set(d->stats, KVS_STAT_disk_bytes, d->bytes);
}

/* ---- segments (lock held) ------------------------------------------------------------------ */

static seg_t *seg_by_id(kvs_disk_t *d, uint64_t id) {
  size_t lo = 0, hi = d->n_segs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (d->segs[mid]->id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < d->n_segs && d->segs[lo]->id == id ? d->segs[lo] : NULL;
}

static int seg_push(kvs_disk_t *d, seg_t *s) {
  if (d->n_segs == d->segs_cap) {
    size_t cap = d->segs_cap ? d->segs_cap * 2 : 64;
    seg_t **n = realloc(d->segs, cap * sizeof *n);
    if (!n) return -ENOMEM;
    d->segs = n, d->segs_cap = cap;
  }
  d->segs[d->n_segs++] = s;
  return 0;
}

static void seg_unref(kvs_disk_t *d, seg_t *s) {
  pthread_mutex_lock(&d->lock);
  bool gone = --s->refs == 0 && s->dead;
  pthread_mutex_unlock(&d->lock);
  if (gone) seg_close(s);
}

/* Delete the oldest segment: its file, its index entries. Returns the records it held. */
static uint64_t seg_drop_oldest(kvs_disk_t *d) {
  seg_t *s = d->segs[0];
  memmove(d->segs, d->segs + 1, (d->n_segs - 1) * sizeof *d->segs);
  d->n_segs--;
  if (d->n_segs == 0) d->active = false;
  char name[24];
  kvs_disk_segment_name(s->id, name);
  if (d->writable) unlinkat(d->dir_fd, name, 0);
  idx_drop_seg(d, s->id);
  d->bytes -= s->size;
  uint64_t records = s->records;
  s->dead = true;
  if (s->refs == 0) seg_close(s);
  return records;
}

/* ---- faults (writer thread) ---------------------------------------------------------------- */

static fault_t classify(int err, bool creating) {
  switch (-err) {
  case ENOSPC: return creating ? FAULT_NOINODES : FAULT_NOSPACE;
  case EIO: return FAULT_IO;
  case EROFS: case EACCES: case EPERM: return FAULT_READONLY;
  case ENOENT: case ENOTDIR: case ESTALE: return FAULT_MISSING;
  case EDQUOT: return FAULT_QUOTA;
  case EFBIG: return FAULT_TOOBIG;
  default: return FAULT_OTHER;
  }
}

/* A write failed: log its kind once, count it, pause writes, and close the active segment (the
 * next write opens a new file, which checks the directory again). */
static void write_fault(kvs_disk_t *d, int err, const char *what) {
  fault_t f = classify(err, false);
  if (f == FAULT_NOSPACE && strcmp(what, "create a segment in") == 0) {
    struct statvfs vfs; /* ENOSPC creating a file: out of blocks, or out of inodes */
    if (fstatvfs(d->dir_fd, &vfs) == 0 && vfs.f_files > 0 && vfs.f_ffree == 0) f = FAULT_NOINODES;
  }
  kvs_stats_inc(d->stats, KVS_STAT_disk_write_errors);
  if (!(d->logged & (1u << f))) {
    d->logged |= 1u << f;
    kvs_log_error("disk tier: cannot %s %s: %s (%s): writes paused, retried with a back-off; "
                  "serving goes on from memory and what is on disk", what, d->dir, strerror(-err),
                  fault_text[f]);
  }
  pthread_mutex_lock(&d->qlock);
  d->paused_until_ms = kvs__now_ms() + d->backoff_ms;
  pthread_mutex_unlock(&d->qlock);
  d->backoff_ms = d->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d->backoff_ms * 2;
  d->faulted = true;
  pthread_mutex_lock(&d->lock);
  d->active = false;
  pthread_mutex_unlock(&d->lock);
}

static void write_ok(kvs_disk_t *d) {
  if (d->faulted) kvs_log_warn("disk tier: writes to %s work again", d->dir);
  d->faulted = false;
  d->backoff_ms = BACKOFF_MIN_MS;
}

/* ---- write path (writer thread) ------------------------------------------------------------ */

/* Whether the next large payload is written with O_DIRECT: as kvs_disk_pick_direct says, a
 * buffered write still waiting for its sync counting as slower (its cost is not known yet,
 * and a second buffered probe before it is would measure the same). */
static bool write_direct_next(const kvs_disk_t *d) {
  uint64_t buffered = d->writes.ns_mib[1] ? d->writes.ns_mib[1] : d->pend_bytes ? UINT64_MAX : 0;
  return kvs_disk_pick_direct(d->writes.ns_mib[0], buffered, d->writes.n);
}

static int sync_active(kvs_disk_t *d) {
  if (!d->unsynced) return 0;
  pthread_mutex_lock(&d->lock);
  int fd = d->active ? d->segs[d->n_segs - 1]->fd : -1;
  pthread_mutex_unlock(&d->lock);
  uint64_t t0 = kvs__now_ns();
  d->unsynced = 0;
  if (fd >= 0 && fdatasync(fd) < 0) return -errno;
  /* The whole sync is the buffered writes' cost: the direct bytes it covers are on the device
   * already, what is left for them (the file's size and extents) is small. */
  if (d->pend_bytes)
    method_measured(&d->writes, false, d->pend_ns + (kvs__now_ns() - t0), d->pend_bytes);
  d->pend_ns = d->pend_bytes = 0;
  return 0;
}

/* Make room for a record of len bytes: drop the oldest segments past the bound, open a new
 * active segment when there is none or it is full. 0 and the active segment, or an errno. */
static int room_for(kvs_disk_t *d, uint64_t len, seg_t **out) {
  pthread_mutex_lock(&d->lock);
  uint64_t dropped = 0;
  while (d->n_segs && d->bytes + len > d->size_limit) dropped += seg_drop_oldest(d);
  bool need = !d->active ||
              (d->segs[d->n_segs - 1]->size && d->segs[d->n_segs - 1]->size + len > d->seg_target);
  uint64_t id = d->n_segs ? d->segs[d->n_segs - 1]->id + 1 : 1;
  if (!need) *out = d->segs[d->n_segs - 1];
  gauges(d);
  pthread_mutex_unlock(&d->lock);
  if (dropped) kvs_stats_add(d->stats, KVS_STAT_disk_evictions, dropped);
  if (!need) return 0;
  /* The full segment is closed for writing: its bytes reach the disk first (batch, always). */
  if (d->sync != KVS_DISK_SYNC_NONE) KVS_TRY(sync_active(d));
  char name[24];
  kvs_disk_segment_name(id, name);
  int fd = openat(d->dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  if (d->sync != KVS_DISK_SYNC_NONE) fsync(d->dir_fd); /* the new name survives a crash */
  seg_t *s = calloc(1, sizeof *s);
  pthread_mutex_lock(&d->lock);
  int rc = s ? seg_push(d, s) : -ENOMEM;
  if (rc == 0) {
    s->id = id, s->fd = fd, s->dfd = open_direct(d, name);
    d->active = true;
    *out = s;
  }
  pthread_mutex_unlock(&d->lock);
  if (rc < 0) {
    free(s);
    close(fd);
    unlinkat(d->dir_fd, name, 0);
  }
  return rc;
}

/* Write a version 2 record at `at` of segment s: head (head_span bytes, aligned to
 * DIO_ALIGN), payload (len bytes, in the pool: page-aligned), zeros to rec_len; then, with
 * --disk-sync always, fdatasync. A payload of KVS_DISK_MEASURED or more goes by the
 * method measured faster (write_direct_next), timed into its average: O_DIRECT through dfd
 * (the head, the payload's whole blocks straight from the extent, its last partial block and
 * the padding through an aligned block: no page-cache copy, no page-cache pages to find), or
 * buffered through fd, whose cost is complete only at the fdatasync that follows. 0 or a
 * negative errno. */
static int write_record(kvs_disk_t *d, seg_t *s, uint64_t at, const uint8_t *head,
                        uint64_t head_span, const uint8_t *payload, uint64_t len,
                        uint64_t rec_len) {
  static const uint8_t zeros[KVS_DISK_ALIGN];
  _Alignas(DIO_ALIGN) uint8_t last[KVS_DISK_ALIGN];
  bool large = len >= KVS_DISK_MEASURED && s->dfd >= 0 && atomic_load(&d->direct);
  bool direct = large && write_direct_next(d);
  uint64_t t0 = kvs__now_ns();
  int rc = -EINVAL;
  if (direct) {
    uint64_t body = len & ~(uint64_t)(KVS_DISK_ALIGN - 1), tail = len - body;
    if (tail) {
      memcpy(last, payload + body, (size_t)tail);
      memset(last + tail, 0, (size_t)(KVS_DISK_ALIGN - tail));
    }
    struct iovec iov[3] = {{(void *)head, (size_t)head_span},
                           {(void *)payload, (size_t)body},
                           {last, (size_t)(rec_len - head_span - body)}};
    rc = pwritev_all(s->dfd, iov, iov[2].iov_len ? 3 : 2, at);
    if (rc == -EINVAL) { /* the file system wants a larger alignment: buffered from now on */
      direct_off(d);
      direct = large = false;
    }
  }
  if (!direct) {
    struct iovec iov[3] = {{(void *)head, (size_t)head_span},
                           {(void *)payload, (size_t)len},
                           {(void *)zeros, (size_t)(rec_len - head_span - len)}};
    rc = pwritev_all(s->fd, iov, iov[2].iov_len ? 3 : 2, at);
  }
  if (rc == 0 && d->sync == KVS_DISK_SYNC_ALWAYS && fdatasync(s->fd) < 0) rc = -errno;
  if (rc < 0 || !large) return rc;
  uint64_t ns = kvs__now_ns() - t0;
  if (direct || d->sync != KVS_DISK_SYNC_BATCH) {
    method_measured(&d->writes, direct, ns, len);
  } else {
    d->pend_ns += ns;
    d->pend_bytes += len;
  }
  d->writes.n++;
  kvs_stats_inc(d->stats, direct ? KVS_STAT_disk_writes_direct : KVS_STAT_disk_writes_buffered);
  return 0;
}

static void write_job(kvs_disk_t *d, job_t *jb) {
  kvs_object_view_t v;
  bool pinned = kvs_store_read_pinned(d->store, d->owner, jb->xfer, &v, 1) == 1;
  pthread_mutex_lock(&d->lock);
  bool present = idx_find(d, jb->keys[0]) != NULL;
  pthread_mutex_unlock(&d->lock);
  uint32_t n_aliases = jb->n - 1;
  uint64_t len = pinned ? v.extent.length : 0;
  uint64_t rec_len = kvs_disk_record_len(KVS_DISK_VERSION, n_aliases, len);
  if (!pinned || present || rec_len > d->size_limit || n_aliases > KVS_DISK_MAX_ALIASES) {
    kvs_store_release(d->store, d->owner, jb->xfer);
    if (!present) kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
    return;
  }
  seg_t *s = NULL;
  int rc = room_for(d, rec_len, &s);
  if (rc < 0) {
    kvs_store_release(d->store, d->owner, jb->xfer);
    kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
    write_fault(d, rc, "create a segment in");
    return;
  }
  /* Header and aliases from a small aligned buffer, the payload straight from the pinned
   * extent: a large one by the method measured faster (write_record), a small one buffered
   * (one small O_DIRECT write per object would wait for the device each time). */
  const uint8_t *payload = kvs_pool_base(kvs_store_pool(d->store)) + v.extent.offset;
  uint64_t head_span = kvs_disk_payload_off(KVS_DISK_VERSION, n_aliases);
  uint8_t *head = aligned_alloc(DIO_ALIGN, KVS__ALIGN_UP((size_t)head_span, (size_t)DIO_ALIGN));
  if (!head) {
    kvs_store_release(d->store, d->owner, jb->xfer);
    kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
    return;
  }
  memset(head, 0, (size_t)head_span);
  uint64_t seq = d->next_seq++;
  kvs_disk_encode_head(head, KVS_DISK_VERSION, jb->keys[0], &jb->keys[1], n_aliases, &v.layout,
                       len, XXH3_64bits(payload, (size_t)len), seq);
  uint64_t at = s->size; /* only this thread moves it */
  rc = write_record(d, s, at, head, head_span, payload, len, rec_len);
  free(head);
  /* A pin still live now was live during the write (a reclaimed lease never comes back under
   * the same id): the bytes written are the object's. Otherwise the record is cut off. */
  bool held = kvs_store_release(d->store, d->owner, jb->xfer) == 0;
  if (rc < 0 || !held) {
    if (ftruncate(s->fd, (off_t)at) < 0) { /* the record is torn: the scan drops it */ }
    kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
    if (rc < 0) write_fault(d, rc, "write to");
    return;
  }
  write_ok(d);
  pthread_mutex_lock(&d->lock);
  s->size = at + rec_len;
  s->records++;
  d->bytes += rec_len;
  bool indexed = idx_put(d, jb->keys[0], s->id, at, true) == 0;
  for (uint32_t a = 1; indexed && a < jb->n; a++)
    if (!idx_find(d, jb->keys[a])) indexed = idx_put(d, jb->keys[a], s->id, at, false) == 0;
  gauges(d);
  pthread_mutex_unlock(&d->lock);
  kvs_stats_inc(d->stats, KVS_STAT_disk_writes);
  kvs_stats_add(d->stats, KVS_STAT_disk_bytes_written, rec_len);
  if (d->sync == KVS_DISK_SYNC_BATCH) {
    d->unsynced += rec_len;
    if (d->unsynced >= BATCH_SYNC_BYTES && (rc = sync_active(d)) < 0) write_fault(d, rc, "sync");
  }
}

static void *writer_main(void *arg) {
  kvs_disk_t *d = arg;
  pthread_setname_np(pthread_self(), "kvshim-disk-w"); /* for top and perf; best effort */
  pthread_mutex_lock(&d->qlock);
  job_t *jb;
  while ((jb = KVS__FIFO_WAIT_POP(d->w_head, d->w_tail, d->stop, &d->wcond, &d->qlock))) {
    d->n_writes--;
    d->busy++;
    bool paused = kvs__now_ms() < d->paused_until_ms;
    pthread_mutex_unlock(&d->qlock);
    if (paused) {
      kvs_store_release(d->store, d->owner, jb->xfer);
      kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
    } else {
      write_job(d, jb);
    }
    pthread_mutex_lock(&d->qlock);
    d->pinned_bytes -= jb->bytes;
    free(jb);
    bool drained = !d->w_head;
    if (drained && d->sync == KVS_DISK_SYNC_BATCH) { /* the queue ran dry: sync the batch */
      pthread_mutex_unlock(&d->qlock);
      int rc = sync_active(d);
      if (rc < 0) write_fault(d, rc, "sync");
      pthread_mutex_lock(&d->qlock);
    }
    d->busy--;
    pthread_cond_broadcast(&d->idle);
  }
  pthread_mutex_unlock(&d->qlock);
  int rc = sync_active(d);
  if (rc < 0) write_fault(d, rc, "sync");
  return NULL;
}

/* ---- read path (reader thread) ------------------------------------------------------------- */

enum { READ_HIT, READ_MISS, READ_NOROOM, READ_BAD, READ_ERROR };

/* A record that failed a check: out of the index (its primary and aliases), its magic zeroed
 * so no later scan finds it, counted. */
static void drop_bad(kvs_disk_t *d, seg_t *s, uint64_t off, kvs_key_t key, const uint8_t *head,
                     const kvs_disk_record_t *rec) {
  pthread_mutex_lock(&d->lock);
  idx_del(d, key, s->id, off);
  if (head && rec) {
    idx_del(d, rec->key, s->id, off);
    for (uint32_t a = 0; a < rec->n_aliases; a++) idx_del(d, kvs_disk_alias(head, a), s->id, off);
  }
  gauges(d);
  pthread_mutex_unlock(&d->lock);
  static const uint8_t zero[4];
  if (d->writable && pwrite(s->fd, zero, sizeof zero, (off_t)off) < 0) { /* a read-only DIR */ }
  kvs_stats_inc(d->stats, KVS_STAT_disk_bad);
  char hex[KVS_KEY_HEX_LEN + 1];
  kvs_key_format(key, hex);
  kvs_log_warn("disk tier: the record of %s (segment %" PRIu64 ", offset %" PRIu64
               ") failed its check: dropped, not served", hex, s->id, off);
}

static void read_error(kvs_disk_t *d, int err) {
  kvs_stats_inc(d->stats, KVS_STAT_disk_read_errors);
  static int logged; /* once per process */
  if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
    kvs_log_error("disk tier: cannot read %s: %s: served as a miss", d->dir, strerror(-err));
}

/* Bring key's object from disk into the pool under its primary and aliases. */
static int read_one(kvs_disk_t *d, kvs_key_t key) {
  pthread_mutex_lock(&d->lock);
  entry_t *e = idx_find(d, key);
  seg_t *s = e ? seg_by_id(d, e->seg) : NULL;
  uint64_t off = e ? e->off & ~PRIMARY_BIT : 0, seg_size = s ? s->size : 0;
  if (s) s->refs++;
  pthread_mutex_unlock(&d->lock);
  if (!s) return READ_MISS;
  /* first: the head read; its last block doubles as pread_direct's bounce block */
  _Alignas(DIO_ALIGN) uint8_t first[HEAD_READ + KVS_DISK_ALIGN];
  uint8_t *head = first, *bounce = first + HEAD_READ;
  kvs_disk_record_t rec;
  int out = READ_BAD;
  size_t n = seg_size - off < HEAD_READ ? (size_t)(seg_size - off) : HEAD_READ;
  /* O_DIRECT when the segment has it: no page cache filled (or read ahead) for a head */
  bool direct = s->dfd >= 0 && atomic_load(&d->direct) && n % KVS_DISK_ALIGN == 0 &&
                off % KVS_DISK_ALIGN == 0;
  int rc = direct ? pread_direct(s->dfd, first, n, off, bounce) : -EINVAL;
  if (rc == -EINVAL) {
    if (direct) direct_off(d);
    direct = false;
    rc = pread_all(s->fd, first, n, off);
  }
  if (rc < 0) {
    read_error(d, rc);
    seg_unref(d, s);
    return READ_ERROR;
  }
  bool ok = kvs_disk_parse_header(first, n, &rec) == 0 && rec.record_len <= seg_size - off;
  if (ok && rec.head_len > n) { /* many aliases: read the whole head */
    head = malloc((size_t)rec.head_len);
    ok = head && pread_all(s->fd, head, (size_t)rec.head_len, off) == 0;
  }
  ok = ok && kvs_disk_check_head(head, &rec) == 0;
  /* A version 2 payload is block-aligned: read with O_DIRECT, straight from the device into
   * the extent. A version 1 payload is buffered: start the I/O for this record and the one
   * after it (a prefix's chunks are written in order), the device reads ahead while this
   * payload is copied and checked. */
  direct = direct && ok && rec.version == KVS_DISK_VERSION && atomic_load(&d->direct);
  if (ok && !direct)
    posix_fadvise(s->fd, (off_t)off, (off_t)(2 * rec.record_len), POSIX_FADV_WILLNEED);
  bool named = ok && kvs_key_eq(rec.key, key);
  for (uint32_t a = 0; ok && !named && a < rec.n_aliases; a++)
    named = kvs_key_eq(kvs_disk_alias(head, a), key);
  kvs_key_t *keys = ok && named ? malloc((1 + rec.n_aliases) * sizeof *keys) : NULL;
  if (keys) {
    keys[0] = rec.key;
    for (uint32_t a = 0; a < rec.n_aliases; a++) keys[1 + a] = kvs_disk_alias(head, a);
    /* Reserve under every key of the object; a primary the pool holds already cannot take new
     * aliases (the store binds them at publish), so the key asked for then gets its own copy. */
    uint8_t outcome = 0;
    kvs_extent_t ext;
    kvs_xfer_t xfer = 0;
    rc = kvs_store_reserve_object(d->store, d->owner, keys, 1 + rec.n_aliases, &rec.layout, 0,
                                  &outcome, &ext, &xfer);
    if (rc != 1 && outcome == KVS_RES_PRESENT && !kvs_key_eq(key, rec.key))
      rc = kvs_store_reserve_object(d->store, d->owner, &key, 1, &rec.layout, 0, &outcome, &ext,
                                    &xfer);
    if (rc == 1) {
      /* The payload straight into the reserved extent, checked there before it is published. */
      uint8_t *dst = kvs_pool_base(kvs_store_pool(d->store)) + ext.offset;
      bool in_head = head == first && rec.payload_off + rec.payload_len <= n;
      if (in_head) /* a small record: its payload came with the head read */
        memcpy(dst, first + rec.payload_off, (size_t)rec.payload_len), rc = 0;
      else
        rc = direct && (uintptr_t)dst % KVS_DISK_ALIGN == 0
               ? read_payload(d, s, dst, (size_t)rec.payload_len, off + rec.payload_off, bounce)
               : -EINVAL;
      if (!in_head && rc == -EINVAL) {
        if (direct && (uintptr_t)dst % KVS_DISK_ALIGN == 0) direct_off(d);
        rc = pread_all(s->fd, dst, (size_t)rec.payload_len, off + rec.payload_off);
      }
      if (rc < 0) {
        kvs_store_abort(d->store, d->owner, xfer);
        read_error(d, rc);
        out = READ_ERROR;
      } else if (XXH3_64bits(dst, (size_t)rec.payload_len) != rec.payload_hash) {
        kvs_store_abort(d->store, d->owner, xfer);
        out = READ_BAD;
      } else {
        out = kvs_store_commit(d->store, d->owner, xfer) == 0 ? READ_HIT : READ_NOROOM;
        if (out == READ_HIT) kvs_stats_add(d->stats, KVS_STAT_disk_bytes_read, rec.payload_len);
      }
    } else {
      out = outcome == KVS_RES_PRESENT ? READ_HIT : READ_NOROOM;
    }
    free(keys);
  } else if (ok && named) {
    out = READ_NOROOM; /* no memory for the key list */
  }
  if (out == READ_BAD) drop_bad(d, s, off, key, ok ? head : NULL, ok ? &rec : NULL);
  if (head != first) free(head);
  seg_unref(d, s);
  return out;
}

static void finish_fetch(kvs_disk_t *d, uint64_t token) {
  pthread_mutex_lock(&d->qlock);
  if (d->coord) kvs_coord_remote_done(d->coord, token); /* never blocks */
  pthread_mutex_unlock(&d->qlock);
}

static void fetch(kvs_disk_t *d, const job_t *jb) {
  size_t i = jb->found, n = jb->n;
  int have = kvs_store_lookup(d->store, d->owner, &jb->keys[i], n - i, false, NULL);
  if (have > 0) i += (size_t)have;
  while (i < n) {
    if (kvs__now_ms() >= jb->deadline_ms) break; /* the coordinator answers and counts it */
    int r = read_one(d, jb->keys[i]);
    if (r != READ_HIT) {
      if (r != READ_ERROR) kvs_stats_inc(d->stats, KVS_STAT_disk_misses);
      break;
    }
    /* The object's aliases later in the run are bound now too. */
    have = kvs_store_lookup(d->store, d->owner, &jb->keys[i + 1], n - i - 1, false, NULL);
    size_t got = 1 + (have > 0 ? (size_t)have : 0);
    kvs_stats_add(d->stats, KVS_STAT_disk_hits, got);
    i += got;
  }
  /* What the disk lacks goes to the tier below, under the same token (it answers). */
  if (i < n && d->has_next &&
      d->next.fetch(d->next.ctx, jb->keys, i, n, jb->deadline_ms, jb->token) == 0)
    return;
  finish_fetch(d, jb->token);
}

static void *reader_main(void *arg) {
  kvs_disk_t *d = arg;
  pthread_setname_np(pthread_self(), "kvshim-disk-r");
  pthread_mutex_lock(&d->qlock);
  job_t *jb;
  while ((jb = KVS__FIFO_WAIT_POP(d->r_head, d->r_tail, d->stop, &d->rcond, &d->qlock))) {
    pthread_mutex_unlock(&d->qlock);
    fetch(d, jb);
    free(jb);
    pthread_mutex_lock(&d->qlock);
  }
  pthread_mutex_unlock(&d->qlock);
  return NULL;
}

/* ---- coordinator hooks (coordinator thread: never block on I/O) ---------------------------- */

static job_t *job_new(const kvs_key_t *keys, size_t n) {
  job_t *jb = malloc(sizeof *jb + n * sizeof(kvs_key_t));
  if (!jb) return NULL;
  memset(jb, 0, sizeof *jb);
  jb->n = (uint32_t)n;
  memcpy(jb->keys, keys, n * sizeof(kvs_key_t));
  return jb;
}

static int hook_fetch(void *ctx, const kvs_key_t *keys, size_t found, size_t n,
                      uint64_t deadline_ms, uint64_t token) {
  kvs_disk_t *d = ctx;
  job_t *jb = job_new(keys, n);
  if (!jb) return d->has_next ? d->next.fetch(d->next.ctx, keys, found, n, deadline_ms, token)
                              : -ENOMEM;
  jb->found = (uint32_t)found;
  jb->deadline_ms = deadline_ms;
  jb->token = token;
  pthread_mutex_lock(&d->qlock);
  bool take = !d->stop;
  if (take) {
    KVS__FIFO_PUSH(d->r_head, d->r_tail, jb);
    pthread_cond_signal(&d->rcond);
  }
  pthread_mutex_unlock(&d->qlock);
  if (!take) free(jb);
  return take ? 0 : -EAGAIN;
}

static void queue_write(kvs_disk_t *d, const kvs_key_t *keys, size_t n) {
  pthread_mutex_lock(&d->qlock);
  bool open = !d->stop && d->n_writes < WRITE_QUEUE_MAX && d->pinned_bytes < d->pinned_cap &&
              kvs__now_ms() >= d->paused_until_ms;
  pthread_mutex_unlock(&d->qlock);
  kvs_xfer_t xfer = 0;
  kvs_object_view_t v;
  /* Pin the object so its extent stays ours until the writer has written it. */
  if (!open || kvs_store_lookup(d->store, d->owner, keys, 1, true, &xfer) != 1) {
    kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
    return;
  }
  job_t *jb = kvs_store_read_pinned(d->store, d->owner, xfer, &v, 1) == 1 ? job_new(keys, n)
                                                                           : NULL;
  pthread_mutex_lock(&d->qlock);
  bool take = jb && !d->stop;
  if (take) {
    jb->xfer = xfer;
    jb->bytes = v.extent.length;
    d->pinned_bytes += jb->bytes;
    KVS__FIFO_PUSH(d->w_head, d->w_tail, jb);
    d->n_writes++;
    pthread_cond_signal(&d->wcond);
  }
  pthread_mutex_unlock(&d->qlock);
  if (!take) {
    free(jb);
    kvs_store_release(d->store, d->owner, xfer);
    kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
  }
}

static void hook_published(void *ctx, const kvs_key_t *keys, size_t n, bool object) {
  kvs_disk_t *d = ctx;
  if (d->writable) {
    if (object) queue_write(d, keys, n);
    else
      for (size_t i = 0; i < n; i++) queue_write(d, &keys[i], 1);
  }
  if (d->has_next) d->next.published(d->next.ctx, keys, n, object);
}

/* ---- scan ---------------------------------------------------------------------------------- */

typedef struct scan_ctx {
  kvs_disk_t *d;
  seg_t *s;
  int err;
} scan_ctx_t;

static int scan_record(void *ctx, const kvs_disk_record_t *rec, const uint8_t *head,
                       uint64_t off) {
  scan_ctx_t *sc = ctx;
  kvs_disk_t *d = sc->d;
  sc->s->records++;
  if (rec->seq >= d->next_seq) d->next_seq = rec->seq + 1;
  sc->err = idx_put(d, rec->key, sc->s->id, off, true);
  for (uint32_t a = 0; sc->err == 0 && a < rec->n_aliases; a++)
    sc->err = idx_put(d, kvs_disk_alias(head, a), sc->s->id, off, false);
  return sc->err != 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The segment ids in a directory, ascending (*ids malloc'd). */
static int list_segments(int dir_fd, uint64_t **ids, size_t *n) {
  int fd = dup(dir_fd);
  DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
  if (!dir) {
    int e = -errno;
    if (fd >= 0) close(fd);
    return e;
  }
  rewinddir(dir);
  size_t cap = 64, k = 0;
  uint64_t *v = malloc(cap * sizeof *v);
  struct dirent *de;
  while (v && (de = readdir(dir)) != NULL) {
    uint64_t id;
    if (kvs_disk_segment_id(de->d_name, &id) < 0 || id == 0) continue;
    if (k == cap) {
      uint64_t *nv = realloc(v, (cap *= 2) * sizeof *nv);
      if (!nv) {
        free(v);
        v = NULL;
        break;
      }
      v = nv;
    }
    v[k++] = id;
  }
  closedir(dir);
  if (!v) return -ENOMEM;
  qsort(v, k, sizeof *v, cmp_u64);
  *ids = v;
  *n = k;
  return 0;
}

/* Walk every segment into the index; cut torn tails; delete empty segments. */
static int scan(kvs_disk_t *d, uint64_t *bad) {
  uint64_t *ids = NULL;
  size_t n = 0;
  KVS_TRY(list_segments(d->dir_fd, &ids, &n));
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    char name[24];
    kvs_disk_segment_name(ids[i], name);
    int fd = openat(d->dir_fd, name, (d->writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
      kvs_log_warn("disk tier: cannot open %s/%s: %s: skipped", d->dir, name, strerror(errno));
      if (fd >= 0) close(fd);
      continue;
    }
    if (st.st_size == 0) {
      close(fd);
      if (d->writable) unlinkat(d->dir_fd, name, 0);
      continue;
    }
    seg_t *s = calloc(1, sizeof *s);
    if (s) s->dfd = -1;
    if (!s || seg_push(d, s) < 0) {
      free(s);
      close(fd);
      rc = -ENOMEM;
      break;
    }
    s->id = ids[i], s->fd = fd, s->dfd = open_direct(d, name);
    scan_ctx_t sc = {d, s, 0};
    uint64_t end = 0, seg_bad = 0;
    int wrc = kvs_disk_walk((uint64_t)st.st_size, fd_read_at, &fd, scan_record, &sc, &seg_bad,
                            &end);
    if (sc.err) rc = sc.err;
    if (wrc < 0) /* what was read before stays indexed (those records lie below) */
      kvs_log_warn("disk tier: reading %s/%s failed (%s): kept what was read before",
                   d->dir, name, strerror(-wrc));
    *bad += seg_bad;
    /* A torn tail (a write cut short by a crash) is cut off so the file holds records only. */
    if (wrc == 0 && end < (uint64_t)st.st_size && d->writable && ftruncate(fd, (off_t)end) == 0)
      st.st_size = (off_t)end;
    s->size = (uint64_t)st.st_size;
    d->bytes += s->size;
  }
  free(ids);
  return rc;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

/* Lock DIR/lock exclusively (the holder's pid written in it). 0, -EBUSY (pid in *holder), or an
 * errno. A read-only DIR without a lock file is used unlocked (nobody can write it). */
static int take_lock(kvs_disk_t *d, long *holder) {
  int fd = openat(d->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) {
    fd = openat(d->dir_fd, "lock", O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 0;
  }
  if (fd < 0) return -errno;
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    char buf[32] = "";
    ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
    if (r > 0) buf[r] = '\0';
    *holder = strtol(buf, NULL, 10);
    close(fd);
    return e == EWOULDBLOCK ? -EBUSY : -e;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)len, 0) < 0) { /* read-only: no pid */ }
  d->lock_fd = fd;
  return 0;
}

/* Can we create files in DIR? (root ignores modes; a read-only mount refuses everyone) */
static bool dir_writable(kvs_disk_t *d) {
  struct statvfs vfs;
  if (fstatvfs(d->dir_fd, &vfs) == 0 && (vfs.f_flag & ST_RDONLY)) return false;
  return faccessat(d->dir_fd, ".", W_OK, AT_EACCESS) == 0;
}

int kvs_disk_create(const kvs_disk_config_t *cfg, kvs_disk_t **out, char *err, size_t errlen) {
  if (errlen) err[0] = '\0';
  if (!cfg || !cfg->opts || !cfg->store || !out) return -EINVAL;
  const kvs_options_t *o = cfg->opts;
  kvs_stats_t *stats = cfg->stats ? cfg->stats : kvs_stats_global();
  if (!o->disk[0]) {
    snprintf(err, errlen, "no directory (KVSHIM_DISK or --disk DIR)");
    return -EINVAL;
  }
  kvs_disk_t *d = calloc(1, sizeof *d);
  if (!d) return -ENOMEM;
  d->store = cfg->store;
  d->stats = stats;
  snprintf(d->dir, sizeof d->dir, "%s", o->disk);
  d->dir_fd = d->lock_fd = -1;
  d->size_limit = o->disk_size;
  d->seg_target = d->size_limit / 8;
  if (d->seg_target > SEG_MAX_TARGET) d->seg_target = SEG_MAX_TARGET;
  if (d->seg_target < SEG_MIN_TARGET) d->seg_target = SEG_MIN_TARGET;
  d->sync = (int)o->disk_sync;
  d->backoff_ms = BACKOFF_MIN_MS;
  d->next_seq = 1;
  atomic_store(&d->direct, true);
  if (cfg->next && cfg->next->fetch && cfg->next->published) {
    d->next = *cfg->next;
    d->has_next = true;
  }
  d->hooks = (kvs_coord_remote_t){d, hook_fetch, hook_published};
  pthread_mutex_init(&d->lock, NULL);
  pthread_mutex_init(&d->qlock, NULL);
  pthread_cond_init(&d->wcond, NULL);
  pthread_cond_init(&d->rcond, NULL);
  pthread_cond_init(&d->idle, NULL);
  int rc = 0;
  long holder = 0;
  if (mkdir(d->dir, 0700) < 0 && errno != EEXIST) {
    rc = -errno;
    snprintf(err, errlen, "cannot create %s: %s", d->dir, strerror(-rc));
  } else if ((d->dir_fd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
    rc = -errno;
    snprintf(err, errlen, "cannot open %s: %s", d->dir, strerror(-rc));
  } else if ((rc = take_lock(d, &holder)) < 0) {
    if (rc == -EBUSY && holder > 0)
      snprintf(err, errlen, "%s is in use by another kvshim serve (pid %ld, lock file %s/lock)",
               d->dir, holder, d->dir);
    else if (rc == -EBUSY)
      snprintf(err, errlen, "%s is in use by another kvshim serve (lock file %s/lock)", d->dir,
               d->dir);
    else
      snprintf(err, errlen, "cannot lock %s/lock: %s", d->dir, strerror(-rc));
  }
  d->tab = rc == 0 ? calloc(INDEX_MIN_CAP, sizeof *d->tab) : NULL;
  d->cap = INDEX_MIN_CAP;
  if (rc == 0 && !d->tab) rc = -ENOMEM;
  if (rc == 0) rc = kvs_store_owner_open(d->store, &d->owner);
  if (rc < 0) {
    if (!err[0]) snprintf(err, errlen, "disk tier: %s", strerror(-rc));
    if (rc != -EBUSY) kvs_stats_inc(stats, KVS_STAT_disk_write_errors);
    kvs_disk_destroy(d, 0);
    return rc;
  }
  d->writable = dir_writable(d);
  uint64_t pool = kvs_pool_header(kvs_store_pool(d->store))->cache_size;
  d->pinned_cap = pool / 4 ? pool / 4 : 1;
  uint64_t t0 = kvs__now_ms(), bad = 0;
  rc = scan(d, &bad);
  d->scan_ms = kvs__now_ms() - t0;
  d->scan_objects = d->objects;
  if (bad) kvs_stats_add(stats, KVS_STAT_disk_bad, bad);
  kvs_stats_set(stats, KVS_STAT_disk_scan_ms, d->scan_ms);
  kvs_stats_set(stats, KVS_STAT_disk_scan_objects, d->scan_objects);
  if (rc < 0) {
    snprintf(err, errlen, "scanning %s: %s", d->dir, strerror(-rc));
    kvs_disk_destroy(d, 0);
    return rc;
  }
  pthread_mutex_lock(&d->lock);
  uint64_t dropped = 0;
  while (d->n_segs && d->bytes > d->size_limit) dropped += seg_drop_oldest(d); /* size lowered */
  gauges(d);
  pthread_mutex_unlock(&d->lock);
  if (dropped) kvs_stats_add(stats, KVS_STAT_disk_evictions, dropped);
  if (!d->writable) {
    kvs_stats_inc(stats, KVS_STAT_disk_write_errors);
    snprintf(err, errlen, "%s is read-only: serving the %" PRIu64 " objects on it, writing "
             "nothing", d->dir, d->objects);
  }
  rc = kvs__prim_thread_start(&d->reader, NULL, reader_main, d);
  d->reader_on = rc == 0;
  if (rc == 0) rc = kvs__prim_thread_start(&d->writer, NULL, writer_main, d);
  d->writer_on = rc == 0;
  if (rc < 0) {
    snprintf(err, errlen, "disk tier: cannot start a thread: %s", strerror(-rc));
    kvs_disk_destroy(d, 0);
    return rc;
  }
  *out = d;
  return 0;
}

const kvs_coord_remote_t *kvs_disk_hooks(kvs_disk_t *d) { return &d->hooks; }

void kvs_disk_attach(kvs_disk_t *d, kvs_coord_t *coord) {
  if (!d) return;
  pthread_mutex_lock(&d->qlock);
  d->coord = coord;
  pthread_mutex_unlock(&d->qlock);
}

void kvs_disk_scan_result(const kvs_disk_t *d, uint64_t *objects, uint64_t *ms) {
  *objects = d->scan_objects;
  *ms = d->scan_ms;
}

void kvs_disk_destroy(kvs_disk_t *d, uint32_t flush_ms) {
  if (!d) return;
  pthread_mutex_lock(&d->qlock);
  d->coord = NULL;
  uint64_t deadline = kvs__now_ms() + flush_ms;
  while ((d->w_head || d->busy) && kvs__now_ms() < deadline) {
    struct timespec ts = kvs__realtime_after_ms(20);
    pthread_cond_timedwait(&d->idle, &d->qlock, &ts);
  }
  if (d->w_head)
    kvs_log_warn("disk tier: %u objects not written at exit (flush took over %u ms)",
                 d->n_writes, flush_ms);
  for (job_t *jb; (jb = KVS__FIFO_POP(d->w_head, d->w_tail)); free(jb))
    kvs_stats_inc(d->stats, KVS_STAT_disk_write_drops);
  for (job_t *jb; (jb = KVS__FIFO_POP(d->r_head, d->r_tail));) free(jb);
  d->n_writes = 0;
  d->stop = true;
  pthread_cond_broadcast(&d->wcond);
  pthread_cond_broadcast(&d->rcond);
  pthread_mutex_unlock(&d->qlock);
  if (d->writer_on) pthread_join(d->writer, NULL);
  if (d->reader_on) pthread_join(d->reader, NULL);
  measured_log("reads", &d->reads);   /* reader and writer joined */
  measured_log("writes", &d->writes);
  if (d->owner) kvs_store_owner_release(d->store, d->owner);
  for (size_t i = 0; i < d->n_segs; i++) seg_close(d->segs[i]);
  free(d->segs);
  free(d->tab);
  if (d->lock_fd >= 0) close(d->lock_fd); /* releases the flock */
  if (d->dir_fd >= 0) close(d->dir_fd);
  pthread_cond_destroy(&d->wcond);
  pthread_cond_destroy(&d->rcond);
  pthread_cond_destroy(&d->idle);
  pthread_mutex_destroy(&d->qlock);
  pthread_mutex_destroy(&d->lock);
  kvs__free_poisoned(d, sizeof *d);
}

/* ---- offline check (`kvshim disk DIR`) ----------------------------------------------------- */

typedef struct check_ctx {
  int fd;
  kvs_disk_report_t *rep;
  uint8_t *buf;
  size_t cap;
} check_ctx_t;

static int check_record(void *ctx, const kvs_disk_record_t *rec, const uint8_t *head,
                        uint64_t off) {
  (void)head;
  check_ctx_t *c = ctx;
  if (rec->payload_len > c->cap) {
    uint8_t *nb = realloc(c->buf, (size_t)rec->payload_len);
    if (!nb) return 1;
    c->buf = nb, c->cap = (size_t)rec->payload_len;
  }
  if (pread_all(c->fd, c->buf, (size_t)rec->payload_len, off + rec->payload_off) < 0 ||
      XXH3_64bits(c->buf, (size_t)rec->payload_len) != rec->payload_hash) {
    c->rep->bad++;
    return 0;
  }
  c->rep->objects++;
  c->rep->keys += 1 + rec->n_aliases;
  return 0;
}

int kvs_disk_check(const char *path, kvs_disk_report_t *out, char *err, size_t errlen) {
  if (errlen) err[0] = '\0';
  int dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    int e = -errno;
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(-e));
    return e;
  }
  kvs_disk_report_t rep;
  memset(&rep, 0, sizeof rep);
  int lfd = openat(dir_fd, "lock", O_RDONLY | O_CLOEXEC);
  if (lfd >= 0 && flock(lfd, LOCK_SH | LOCK_NB) < 0) {
    char buf[32] = "";
    ssize_t r = pread(lfd, buf, sizeof buf - 1, 0);
    if (r > 0) buf[r] = '\0';
    rep.in_use = true;
    rep.holder_pid = strtol(buf, NULL, 10);
  }
  uint64_t *ids = NULL;
  size_t n = 0;
  int rc = list_segments(dir_fd, &ids, &n);
  check_ctx_t c = {-1, &rep, NULL, 0};
  for (size_t i = 0; rc == 0 && i < n; i++) {
    char name[24];
    kvs_disk_segment_name(ids[i], name);
    struct stat st;
    c.fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (c.fd < 0 || fstat(c.fd, &st) < 0) {
      rep.bad++;
      if (c.fd >= 0) close(c.fd);
      continue;
    }
    rep.segments++;
    rep.bytes += (uint64_t)st.st_size;
    if (kvs_disk_walk((uint64_t)st.st_size, fd_read_at, &c.fd, check_record, &c, &rep.bad,
                      NULL) < 0)
      rep.bad++;
    close(c.fd);
  }
  if (rc < 0) snprintf(err, errlen, "cannot list %s: %s", path, strerror(-rc));
  free(c.buf);
  free(ids);
  if (lfd >= 0) close(lfd);
  close(dir_fd);
  if (rc == 0) *out = rep;
  return rc;
}
