/* tests/preload: helpers for the LD_PRELOAD test programs (never preloaded themselves).
 *
 * A test program is a parent that builds an environment (LD_PRELOAD only in the child's),
 * spawns helper children (often itself, re-executed with "--child <workload>"), talks to them
 * over pipes, reads what they leave behind (KVSHIM_STATS, FAKECUDA_LOG, stderr) and talks to
 * their coordinator like a peer would. Every check that fails prints where and why and exits 1.
 *
 * Compile-time configuration (from tests/preload/CMakeLists.txt):
 *   PT_PRELOAD_LIB   path of libkvshim.so
 *   PT_ASAN_RUNTIME  in ASan builds: the sanitizer runtime, which must come first in LD_PRELOAD */
#ifndef KVSHIM_PRELOAD_TESTUTIL_H
#define KVSHIM_PRELOAD_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "tensor.h"

#ifndef PT_PRELOAD_LIB
#error "PT_PRELOAD_LIB must name libkvshim.so"
#endif

_Noreturn void pt_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define PT_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) pt_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                             \
  } while (0)

/* ---- environments ---------------------------------------------------------------------------- */
#define PT_ENV_MAX 512
typedef struct pt_env {
  char *v[PT_ENV_MAX + 1];
  int n;
} pt_env_t;
/* environ without KVSHIM_*, LD_PRELOAD and FAKECUDA_LOG; with LD_PRELOAD=libkvshim.so (after
 * the ASan runtime in ASan builds) when preload is true. */
void pt_env_init(pt_env_t *e, bool preload);
void pt_env_set(pt_env_t *e, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pt_env_free(pt_env_t *e);
/* For programs that are not ours (sh, true, CUDA runtime programs): no leak report at exit in
 * ASan builds. */
void pt_env_foreign(pt_env_t *e);

/* ---- processes -------------------------------------------------------------------------------- */
typedef struct pt_proc {
  pid_t pid;
  FILE *in;  /* the child's stdin (pipes mode), else NULL */
  FILE *out; /* the child's stdout (pipes mode), else NULL */
} pt_proc_t;
typedef struct pt_spawn_opts {
  bool pipes;               /* stdin/stdout as pipes; else stdin /dev/null, stdout to out_path */
  const char *out_path;     /* stdout file when !pipes (NULL: /dev/null) */
  const char *err_path;     /* stderr file (NULL: inherit) */
  rlim_t fsize_limit;       /* RLIMIT_FSIZE for the child (0: unchanged); SIGXFSZ ignored */
} pt_spawn_opts_t;
void pt_spawn(pt_proc_t *p, char *const argv[], pt_env_t *env, const pt_spawn_opts_t *o);
/* Exit status (0..255), or 128 + signal; kills the child and fails after timeout_s. */
int pt_wait(pt_proc_t *p, int timeout_s);
/* Run to completion (no pipes) and return the exit status. */
int pt_run(char *const argv[], pt_env_t *env, const char *out_path, const char *err_path,
           int timeout_s);
/* Read one line from the child's stdout (pipes mode) into buf; fails on EOF. */
void pt_readline(pt_proc_t *p, char *buf, size_t cap);
void pt_writeline(pt_proc_t *p, const char *line);

/* ---- files ------------------------------------------------------------------------------------- */
char *pt_read_file(const char *path, size_t *len); /* NUL-terminated; NULL when missing */
bool pt_exists(const char *path);
int pt_count(const char *text, const char *needle);
/* Value of "name":<number> in a kvshim stats JSON text; -1 when absent. */
long long pt_stat(const char *json, const char *name);
/* mkdtemp under $TMPDIR or /tmp; out gets the path (cap >= 256). */
void pt_mkdtemp(char *out, size_t cap, const char *tag);
void pt_rm_rf(const char *dir);
/* Sockets in <run_dir>/default (full paths, sorted); returns how many (entries up to cap). */
int pt_list_sockets(const char *run_dir, char (*paths)[256], int cap);
/* Entries in a directory (-1 when it does not exist). */
int pt_dir_entries(const char *dir);
const char *pt_self_exe(void);

/* ---- a peer of a coordinator: HELLO (receives the pool fd), STATS, EXPORT_TENSORS ------------ */
typedef struct pt_peer {
  int fd;
  int pool_fd;            /* -1 unless the server offered SHM */
  uint64_t instance_id;   /* the server's */
  uint32_t pid;           /* the server's */
  uint64_t rid;
} pt_peer_t;
void pt_peer_connect(pt_peer_t *p, const char *sock_path);
/* STATS as JSON into buf (NUL-terminated). */
void pt_peer_stats(pt_peer_t *p, char *buf, size_t cap);
/* Descriptors covering [addr, addr + len): returns how many (<= cap are decoded into out). */
int pt_peer_export(pt_peer_t *p, uint64_t addr, uint64_t len, kvs_tensor_desc_t *out, int cap);
void pt_peer_close(pt_peer_t *p);

/* ---- fake driver helpers ----------------------------------------------------------------------- */
/* cuInit, device 0's primary context made current. Exits 1 on failure. */
void pt_cuda_setup(void);

#endif
