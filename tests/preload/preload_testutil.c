/* tests/preload: helpers for the LD_PRELOAD test programs (see preload_testutil.h). */
#include "preload_testutil.h"

#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "proto.h"
#include "sock.h"

extern char **environ;

void pt_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAIL %s:%d: %s: %s\n", file, line, cond, msg);
  fflush(stderr);
  exit(1);
}

/* ---- environments ------------------------------------------------------------------------ */

static bool drop_var(const char *kv) {
  return strncmp(kv, "KVSHIM_", 7) == 0 || strncmp(kv, "LD_PRELOAD=", 11) == 0 ||
         strncmp(kv, "FAKECUDA_LOG=", 13) == 0;
}

/* libkvshim.so: PT_PRELOAD_LIB from the environment (scripts/gpu-check runs a carried build
 * from another directory), else the build's own. */
static const char *pt_preload_lib(void) {
  const char *v = getenv("PT_PRELOAD_LIB");
  return v && *v ? v : PT_PRELOAD_LIB;
}

void pt_env_init(pt_env_t *e, bool preload) {
  memset(e, 0, sizeof *e);
  for (char **v = environ; *v; v++) {
    if (drop_var(*v)) continue;
    PT_CHECK(e->n < PT_ENV_MAX, "environment too large");
    e->v[e->n++] = strdup(*v);
  }
#ifdef PT_ASAN_RUNTIME
  /* Instrumented libraries (the fake driver) may be loaded by programs that are not. */
  if (preload)
    pt_env_set(e, "LD_PRELOAD", "%s:%s", PT_ASAN_RUNTIME, pt_preload_lib());
  else
    pt_env_set(e, "LD_PRELOAD", "%s", PT_ASAN_RUNTIME);
#else
  if (preload) pt_env_set(e, "LD_PRELOAD", "%s", pt_preload_lib());
#endif
}

void pt_env_foreign(pt_env_t *e) {
#ifdef PT_ASAN_RUNTIME
  /* Programs we did not write (sh, the CUDA runtime) keep their allocations until exit. */
  pt_env_set(e, "ASAN_OPTIONS", "detect_leaks=0");
#else
  (void)e;
#endif
}

void pt_env_set(pt_env_t *e, const char *name, const char *fmt, ...) {
  char val[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(val, sizeof val, fmt, ap);
  va_end(ap);
  size_t nl = strlen(name);
  char *kv = malloc(nl + strlen(val) + 2);
  PT_CHECK(kv, "out of memory");
  sprintf(kv, "%s=%s", name, val);
  for (int i = 0; i < e->n; i++)
    if (strncmp(e->v[i], name, nl) == 0 && e->v[i][nl] == '=') {
      free(e->v[i]);
      e->v[i] = kv;
      return;
    }
  PT_CHECK(e->n < PT_ENV_MAX, "environment too large");
  e->v[e->n++] = kv;
  e->v[e->n] = NULL;
}

void pt_env_free(pt_env_t *e) {
  for (int i = 0; i < e->n; i++) free(e->v[i]);
  memset(e, 0, sizeof *e);
}

/* ---- processes ------------------------------------------------------------------------------ */

void pt_spawn(pt_proc_t *p, char *const argv[], pt_env_t *env, const pt_spawn_opts_t *o) {
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (o->pipes) PT_CHECK(pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0, "pipe");
  fflush(NULL);
  pid_t pid = fork();
  PT_CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    if (o->pipes) {
      dup2(in[0], 0);
      dup2(out[1], 1);
    } else {
      int nul = open("/dev/null", O_RDWR);
      dup2(nul, 0);
      int fd = o->out_path ? open(o->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600) : nul;
      dup2(fd, 1);
    }
    if (o->err_path) {
      int fd = open(o->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 2);
    }
    if (o->fsize_limit) {
      signal(SIGXFSZ, SIG_IGN);
      struct rlimit rl = {o->fsize_limit, o->fsize_limit};
      setrlimit(RLIMIT_FSIZE, &rl);
    }
    env->v[env->n] = NULL;
    execve(argv[0], argv, env->v);
    _exit(127);
  }
  p->pid = pid;
  p->in = p->out = NULL;
  if (o->pipes) {
    close(in[0]);
    close(out[1]);
    p->in = fdopen(in[1], "w");
    p->out = fdopen(out[0], "r");
    PT_CHECK(p->in && p->out, "fdopen");
  }
}

int pt_wait(pt_proc_t *p, int timeout_s) {
  if (p->in) {
    fclose(p->in);
    p->in = NULL;
  }
  int st = 0;
  uint64_t deadline = kvs__now_ms() + (uint64_t)timeout_s * 1000;
  for (;;) {
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    PT_CHECK(r >= 0, "waitpid: %s", strerror(errno));
    if (r == p->pid) break;
    if (kvs__now_ms() > deadline) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, &st, 0);
      PT_CHECK(0, "child %d did not finish within %d s", (int)p->pid, timeout_s);
    }
    usleep(2000);
  }
  if (p->out) {
    fclose(p->out);
    p->out = NULL;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int pt_run(char *const argv[], pt_env_t *env, const char *out_path, const char *err_path,
           int timeout_s) {
  pt_proc_t p;
  pt_spawn_opts_t o = {.out_path = out_path, .err_path = err_path};
  pt_spawn(&p, argv, env, &o);
  return pt_wait(&p, timeout_s);
}

void pt_readline(pt_proc_t *p, char *buf, size_t cap) {
  PT_CHECK(fgets(buf, (int)cap, p->out) != NULL, "child %d closed its stdout", (int)p->pid);
  size_t n = strlen(buf);
  if (n && buf[n - 1] == '\n') buf[n - 1] = '\0';
}

void pt_writeline(pt_proc_t *p, const char *line) {
  PT_CHECK(fprintf(p->in, "%s\n", line) > 0 && fflush(p->in) == 0, "write to child");
}

/* ---- files ------------------------------------------------------------------------------------ */

char *pt_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  PT_CHECK(buf, "out of memory");
  for (;;) {
    if (n + 1 >= cap) {
      cap *= 2;
      buf = realloc(buf, cap);
      PT_CHECK(buf, "out of memory");
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    if (r == 0) break;
    n += r;
  }
  fclose(f);
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

bool pt_exists(const char *path) { return access(path, F_OK) == 0; }

int pt_count(const char *text, const char *needle) {
  int n = 0;
  size_t k = strlen(needle);
  for (const char *p = text; p && (p = strstr(p, needle)) != NULL; p += k) n++;
  return n;
}

long long pt_stat(const char *json, const char *name) {
  char key[128];
  snprintf(key, sizeof key, "\"%s\":", name);
  const char *p = json ? strstr(json, key) : NULL;
  return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

void pt_mkdtemp(char *out, size_t cap, const char *tag) {
  const char *t = getenv("TMPDIR");
  snprintf(out, cap, "%s/kvshim-%s-XXXXXX", t && *t ? t : "/tmp", tag);
  PT_CHECK(mkdtemp(out) != NULL, "mkdtemp %s: %s", out, strerror(errno));
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path) < 0 ? 0 : 0;
}
void pt_rm_rf(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static int cmp_names(const void *a, const void *b) { return strcmp(a, b); }

int pt_list_sockets(const char *run_dir, char (*paths)[256], int cap) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/default", run_dir);
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    size_t k = strlen(de->d_name);
    if (k < 5 || strcmp(de->d_name + k - 5, ".sock") != 0) continue;
    if (n < cap) {
      int w = snprintf(paths[n], 256, "%s/%s", dir, de->d_name);
      PT_CHECK(w > 0 && w < 256, "socket path too long");
    }
    n++;
  }
  closedir(d);
  qsort(paths, (size_t)(n < cap ? n : cap), 256, cmp_names);
  return n;
}

int pt_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
  closedir(d);
  return n;
}

const char *pt_self_exe(void) {
  static char path[PATH_MAX];
  if (!path[0]) {
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    PT_CHECK(n > 0, "readlink /proc/self/exe");
    path[n] = '\0';
  }
  return path;
}

/* ---- peer client ----------------------------------------------------------------------------- */

#define PT_RPC_NS (5ull * 1000000000ull)

/* One request, one (possibly multi-frame) reply. *reply is malloc'd (8-byte aligned payload). */
static int pt_rpc(pt_peer_t *p, uint16_t op, const void *payload, size_t len, uint8_t **reply,
                  size_t *rlen, int *fd_out) {
  uint64_t deadline = kvs__now_ns() + PT_RPC_NS;
  kvs_proto_header_t h;
  PT_CHECK(kvs_proto_frame_header(op, 0, ++p->rid, len, 0, KVS_PROTO_MIN_MAX_FRAME, &h) == 0,
           "frame header");
  uint8_t hb[KVS_PROTO_HEADER_SIZE];
  kvs_proto_header_encode(&h, hb);
  struct iovec iov[2] = {{hb, sizeof hb}, {(void *)payload, len}};
  int rc = kvs_sock_send_all(p->fd, iov, len ? 2 : 1, -1, deadline);
  PT_CHECK(rc == 0, "send %s: %s", kvs_proto_opcode_name(op), strerror(-rc));
  size_t cap = 0, n = 0;
  uint8_t *buf = NULL;
  for (int first = 1;; first = 0) {
    uint8_t rb[KVS_PROTO_HEADER_SIZE];
    rc = kvs_sock_recv_all(p->fd, rb, sizeof rb, first ? fd_out : NULL, deadline);
    PT_CHECK(rc == 0, "recv header: %s", strerror(-rc));
    kvs_proto_header_t r;
    rc = kvs_proto_header_decode(rb, sizeof rb, KVS_PROTO_MAX_MAX_FRAME, &r);
    PT_CHECK(rc == 0, "bad reply header: %s", kvs_proto_strerror(rc));
    if (n + r.length + 1 > cap) {
      cap = n + r.length + 1;
      buf = realloc(buf, cap);
      PT_CHECK(buf, "out of memory");
    }
    if (r.length) {
      rc = kvs_sock_recv_all(p->fd, buf + n, r.length, NULL, deadline);
      PT_CHECK(rc == 0, "recv payload: %s", strerror(-rc));
    }
    n += r.length;
    if (r.opcode == KVS_OP_ERROR) {
      kvs_proto_error_t e;
      PT_CHECK(kvs_proto_error_decode(buf, n, &e) == 0, "bad ERROR");
      free(buf);
      return e.code;
    }
    PT_CHECK(r.opcode == op && (r.flags & KVS_PROTO_F_REPLY), "reply to %s has opcode %u",
             kvs_proto_opcode_name(op), r.opcode);
    if (!(r.flags & KVS_PROTO_F_MORE)) break;
  }
  *reply = buf;
  *rlen = n;
  return 0;
}

/* Encode *msgp with encfn, then pt_rpc it as op: the reply in *reply (malloc'd) and *rlen, the fd
 * passed with it in *fd_out (fd_out may be NULL). Any failure fails the test, naming op. */
#define PT_CALL(p, op, encfn, msgp, reply, rlen, fd_out)                                         \
  do {                                                                                           \
    uint8_t req_[512];                                                                           \
    size_t n_;                                                                                   \
    PT_CHECK(encfn(msgp, req_, sizeof req_, &n_) == 0, "encode %s", kvs_proto_opcode_name(op));  \
    int rc_ = pt_rpc(p, op, req_, n_, reply, rlen, fd_out);                                      \
    PT_CHECK(rc_ == 0, "%s refused: %s", kvs_proto_opcode_name(op), kvs_proto_strerror(rc_));    \
  } while (0)

void pt_peer_connect(pt_peer_t *p, const char *sock_path) {
  memset(p, 0, sizeof *p);
  p->pool_fd = -1;
  int rc = kvs_sock_connect(sock_path, kvs__now_ns() + PT_RPC_NS, &p->fd);
  PT_CHECK(rc == 0, "connect %s: %s", sock_path, strerror(-rc));
  kvs_proto_hello_t me;
  memset(&me, 0, sizeof me);
  me.version_min = KVS_PROTO_VERSION_MIN;
  me.version_max = KVS_PROTO_VERSION_MAX;
  me.role = KVS_PROTO_ROLE_TOOL;
  me.pid = (uint32_t)getpid();
  me.caps = KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE;
  me.max_frame = KVS_PROTO_DEFAULT_MAX_FRAME;
  snprintf(me.group, sizeof me.group, "default");
  uint8_t *reply;
  size_t rlen;
  int fd = -1;
  PT_CALL(p, KVS_OP_HELLO, kvs_proto_hello_encode, &me, &reply, &rlen, &fd);
  kvs_proto_hello_t srv;
  PT_CHECK(kvs_proto_hello_decode(reply, rlen, &srv) == 0, "bad HELLO reply");
  free(reply);
  p->pool_fd = fd;
  p->instance_id = srv.instance_id;
  p->pid = srv.pid;
}

void pt_peer_stats(pt_peer_t *p, char *buf, size_t cap) {
  kvs_proto_stats_t m = {KVS_PROTO_STATS_JSON};
  uint8_t *reply;
  size_t rlen;
  PT_CALL(p, KVS_OP_STATS, kvs_proto_stats_encode, &m, &reply, &rlen, NULL);
  kvs_proto_text_t t;
  PT_CHECK(kvs_proto_text_decode(reply, rlen, &t) == 0, "bad STATS reply");
  snprintf(buf, cap, "%.*s", (int)t.len, t.text);
  free(reply);
}

int pt_peer_export(pt_peer_t *p, uint64_t addr, uint64_t len, kvs_tensor_desc_t *out, int cap) {
  kvs_proto_export_t m = {addr, len};
  uint8_t *reply;
  size_t rlen;
  PT_CALL(p, KVS_OP_EXPORT_TENSORS, kvs_proto_export_encode, &m, &reply, &rlen, NULL);
  static kvs_proto_blob_t blobs[KVS_PROTO_MAX_DESCS];
  kvs_proto_export_reply_t rep;
  int rc = kvs_proto_export_reply_decode(reply, rlen, blobs, KVS_PROTO_MAX_DESCS, &rep);
  PT_CHECK(rc == 0, "bad EXPORT_TENSORS reply: %s", kvs_proto_strerror(rc));
  for (uint32_t i = 0; i < rep.n_descs && (int)i < cap; i++) {
    char msg[256];
    rc = kvs_tensor_decode_msg(blobs[i].data, blobs[i].len, &out[i], msg, sizeof msg);
    PT_CHECK(rc == 0, "descriptor %u: %s", i, msg);
  }
  free(reply);
  return (int)rep.n_descs;
}

void pt_peer_close(pt_peer_t *p) {
  if (p->fd >= 0) close(p->fd);
  if (p->pool_fd >= 0) close(p->pool_fd);
  p->fd = p->pool_fd = -1;
}

/* ---- fake driver --------------------------------------------------------------------------- */

void pt_cuda_setup(void) {
  CUdevice dev;
  CUcontext ctx;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  PT_CHECK(r == CUDA_SUCCESS, "CUDA setup failed: %d", (int)r);
}
