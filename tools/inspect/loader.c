/* kvshim inspect: the dynamic loader's search for DT_NEEDED objects (design §11): $ORIGIN and
 * the other dynamic string tokens, DT_RPATH / LD_LIBRARY_PATH / DT_RUNPATH lists, the ld.so
 * cache (read from /etc/ld.so.cache, or from `ldconfig -p` when it is unreadable) and the
 * default directories, as glibc's loader does them. The symbol verdicts are elfscan.c's. */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "elfscan_internal.h"

extern char **environ;

/* Joins dir and name with one '/'. Returns NULL on ENOMEM. */
static char *path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (p == NULL) return NULL;
  memcpy(p, dir, a);
  size_t k = a;
  if (k == 0 || p[k - 1] != '/') p[k++] = '/';
  memcpy(p + k, name, b + 1);
  return p;
}

/* Directory part of path, made absolute against the working directory when that is known
 * (else left relative, as the loader would use it). NULL only on ENOMEM. */
char *kvs__insp_dir_of(const char *path) {
  char cwd[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (slash == NULL) return strdup(getcwd(cwd, sizeof cwd) ? cwd : ".");
  size_t n = (size_t)(slash - path);
  if (n == 0) return strdup("/");
  char *d = strndup(path, n);
  if (d == NULL || d[0] == '/' || getcwd(cwd, sizeof cwd) == NULL) return d;
  char *abs = path_join(cwd, d);
  free(d);
  return abs;
}

/* The multiarch triplet and $LIB / $PLATFORM values of a machine (Debian layout). */
static const char *triplet_of(unsigned machine, unsigned char cls) {
  switch (machine) {
  case EM_X86_64: return cls == ELFCLASS64 ? "x86_64-linux-gnu" : "x86_64-linux-gnux32";
  case EM_386: return "i386-linux-gnu";
  case EM_AARCH64: return "aarch64-linux-gnu";
  case EM_PPC64: return "powerpc64le-linux-gnu";
  case EM_RISCV: return "riscv64-linux-gnu";
  case EM_S390: return "s390x-linux-gnu";
  default: return NULL;
  }
}
static const char *platform_of(unsigned machine) {
  switch (machine) {
  case EM_X86_64: return "x86_64";
  case EM_386: return "i686";
  case EM_AARCH64: return "aarch64";
  default: return "";
  }
}

/* Expands $ORIGIN, $LIB and $PLATFORM (also as ${...}) of in into out. Returns 0, -ENOENT
 * when $ORIGIN is needed but unknown (the loader then ignores the entry), -ENAMETOOLONG. */
static int expand_dst(const ctx_t *c, const char *in, const char *origin, char *out, size_t cap) {
  char libdir[64];
  const char *trip = triplet_of(c->machine, c->elf_class);
  snprintf(libdir, sizeof libdir, "/lib/%s", trip ? trip : "");
  if (trip != NULL && access(libdir, F_OK) == 0)
    memmove(libdir, libdir + 1, strlen(libdir)); /* "lib/<triplet>", the Debian layout */
  else
    snprintf(libdir, sizeof libdir, "%s", c->elf_class == ELFCLASS64 ? "lib64" : "lib");
  size_t o = 0;
  for (const char *p = in; *p;) {
    const char *val = NULL;
    size_t skip = 0;
    if (*p == '$') {
      static const char *const names[] = {"ORIGIN", "LIB", "PLATFORM"};
      for (unsigned k = 0; k < 3 && val == NULL; k++) {
        size_t L = strlen(names[k]);
        if (strncmp(p + 1, names[k], L) == 0) {
          char nx = p[1 + L];
          if (!((nx >= 'A' && nx <= 'Z') || (nx >= 'a' && nx <= 'z') || (nx >= '0' && nx <= '9') ||
                nx == '_'))
            skip = 1 + L;
        } else if (p[1] == '{' && strncmp(p + 2, names[k], L) == 0 && p[2 + L] == '}') {
          skip = 3 + L;
        }
        if (skip) {
          if (k == 0 && origin == NULL) return -ENOENT;
          val = k == 0 ? origin : k == 1 ? libdir : platform_of(c->machine);
        }
      }
    }
    if (val == NULL) {
      if (o + 1 >= cap) return -ENAMETOOLONG;
      out[o++] = *p++;
      continue;
    }
    size_t L = strlen(val);
    if (o + L >= cap) return -ENAMETOOLONG;
    memcpy(out + o, val, L);
    o += L;
    p += skip;
  }
  out[o] = '\0';
  return 0;
}

/* 1 when the file at path is an ELF object the root could load (same class and machine). */
static int compatible(const ctx_t *c, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* never wait on a FIFO */
  if (fd < 0) return 0;
  struct stat st;
  unsigned char h[20];
  ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, h, sizeof h, 0) : -1;
  close(fd);
  if (n != (ssize_t)sizeof h || memcmp(h, ELFMAG, SELFMAG) != 0 || h[EI_CLASS] != c->elf_class)
    return 0;
  unsigned m =
      h[EI_DATA] == ELFDATA2MSB ? (unsigned)h[18] << 8 | h[19] : (unsigned)h[19] << 8 | h[18];
  return m == c->machine;
}

/* Tries name in each directory of the list (':' or ';' separated; empty = "."). Returns a new
 * path, NULL when not found (or ENOMEM: then *oom is set). */
static char *search_list(const ctx_t *c, const char *list, const char *origin, const char *name,
                         bool *oom) {
  if (list == NULL) return NULL;
  const char *p = list;
  for (;;) {
    size_t n = strcspn(p, ":;");
    char raw[PATH_MAX], dir[PATH_MAX];
    if (n < sizeof raw) {
      memcpy(raw, p, n);
      raw[n] = '\0';
      if (n == 0) snprintf(raw, sizeof raw, ".");
      if (expand_dst(c, raw, origin, dir, sizeof dir) == 0) {
        char *cand = path_join(dir, name);
        if (cand == NULL) {
          *oom = true;
          return NULL;
        }
        if (compatible(c, cand)) return cand;
        free(cand);
      }
    }
    if (p[n] == '\0') return NULL;
    p += n + 1;
  }
}

/* ---- the loader cache --------------------------------------------------------------------- */

#define CACHE_MAGIC_NEW "glibc-ld.so.cache"
#define CACHE_VERSION_NEW "1.1"
#define CACHE_MAGIC_OLD "ld.so-1.7.0"
#define CACHE_HDR_NEW 48u   /* magic[17] version[3] nlibs len_strings flags pad[3] ext unused[3] */
#define CACHE_ENTRY_NEW 24u /* int32 flags, uint32 key, uint32 value, uint32 osv, uint64 hwcap */
#define CACHE_HDR_OLD 16u   /* magic[11] pad nlibs */
#define CACHE_ENTRY_OLD 12u


static int read_file(const char *path, unsigned char **buf, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > (1 << 28)) {
    close(fd);
    return -EINVAL;
  }
  unsigned char *b = malloc((size_t)st.st_size);
  if (b == NULL) {
    close(fd);
    return -ENOMEM;
  }
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != (size_t)st.st_size) {
    free(b);
    return -EIO;
  }
  *buf = b;
  *len = got;
  return 0;
}

/* Parses the header of a glibc cache file: the offset of the new-format header, or -EINVAL. */
static long cache_header(const unsigned char *b, size_t len) {
  size_t off = 0;
  if (len >= CACHE_HDR_OLD && memcmp(b, CACHE_MAGIC_OLD, strlen(CACHE_MAGIC_OLD)) == 0) {
    uint32_t n = kvs__insp_rd32(b + 12);
    if (n > len / CACHE_ENTRY_OLD) return -EINVAL;
    off = (CACHE_HDR_OLD + (size_t)n * CACHE_ENTRY_OLD + 7) & ~(size_t)7;
  }
  if (off + CACHE_HDR_NEW > len || memcmp(b + off, CACHE_MAGIC_NEW, 17) != 0 ||
      memcmp(b + off + 17, CACHE_VERSION_NEW, 3) != 0)
    return -EINVAL;
  uint32_t nlibs = kvs__insp_rd32(b + off + 20);
  if (nlibs > (len - off - CACHE_HDR_NEW) / CACHE_ENTRY_NEW) return -EINVAL;
  return (long)off;
}

/* Runs `ldconfig -p` and keeps its "name (...) => path" pairs. Returns 0 or a negative errno. */
static int ldconfig_pairs(ctx_t *c) {
  static const char *const progs[] = {"/sbin/ldconfig", "/usr/sbin/ldconfig", "/bin/ldconfig",
                                      "/usr/bin/ldconfig"};
  const char *prog = NULL;
  for (unsigned i = 0; i < 4 && prog == NULL; i++)
    if (access(progs[i], X_OK) == 0) prog = progs[i];
  if (prog == NULL) return -ENOENT;
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) return -errno;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  char *argv[] = {(char *)prog, (char *)"-p", NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, prog, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(pfd[1]);
  if (rc != 0) {
    close(pfd[0]);
    return -rc;
  }
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  rc = out ? 0 : -ENOMEM;
  while (rc == 0) {
    if (len + 1 >= cap) {
      char *nb = cap < (1u << 26) ? realloc(out, cap * 2) : NULL;
      if (nb == NULL) {
        rc = -ENOMEM;
        break;
      }
      out = nb;
      cap *= 2;
    }
    ssize_t r = read(pfd[0], out + len, cap - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(pfd[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) rc = -EIO;
  if (rc != 0) {
    free(out);
    return rc;
  }
  out[len] = '\0';
  for (char *line = out, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    while (*line == ' ' || *line == '\t') line++;
    char *sp = strchr(line, ' '), *arrow = strstr(line, " => ");
    if (sp == NULL || arrow == NULL || arrow < sp) continue;
    cache_pair_t *np = realloc(c->pairs, (c->n_pairs + 1) * sizeof *np);
    if (np == NULL) {
      rc = -ENOMEM;
      break;
    }
    c->pairs = np;
    np[c->n_pairs].name = strndup(line, (size_t)(sp - line));
    np[c->n_pairs].path = strdup(arrow + 4);
    if (np[c->n_pairs].name == NULL || np[c->n_pairs].path == NULL) {
      free(np[c->n_pairs].name);
      free(np[c->n_pairs].path);
      rc = -ENOMEM;
      break;
    }
    c->n_pairs++;
  }
  free(out);
  return rc;
}

static void cache_load(ctx_t *c) {
  const char *path = c->cfg->ld_cache ? c->cfg->ld_cache : "/etc/ld.so.cache";
  if (read_file(path, &c->cache, &c->cache_len) == 0) {
    long off = cache_header(c->cache, c->cache_len);
    if (off >= 0) {
      c->cache_hdr = (size_t)off;
      c->cache_state = 1;
      return;
    }
    free(c->cache);
    c->cache = NULL;
  }
  c->cache_state = !c->cfg->no_ldconfig && ldconfig_pairs(c) == 0 ? 2 : -1;
}

/* The cache's path for name that the root can load, as a new string; NULL when none. */
static char *cache_lookup(ctx_t *c, const char *name, bool *oom) {
  if (c->cache_state == 0) cache_load(c);
  if (c->cache_state == 2) {
    for (size_t i = 0; i < c->n_pairs; i++)
      if (strcmp(c->pairs[i].name, name) == 0 && compatible(c, c->pairs[i].path)) {
        char *p = strdup(c->pairs[i].path);
        if (p == NULL) *oom = true;
        return p;
      }
    return NULL;
  }
  if (c->cache_state != 1) return NULL;
  const unsigned char *h = c->cache + c->cache_hdr;
  size_t avail = c->cache_len - c->cache_hdr;
  uint32_t nlibs = kvs__insp_rd32(h + 20);
  /* Two passes: entries without hwcaps first (what every CPU can load), then any. */
  for (int pass = 0; pass < 2; pass++)
    for (uint32_t i = 0; i < nlibs; i++) {
      const unsigned char *e = h + CACHE_HDR_NEW + (size_t)i * CACHE_ENTRY_NEW;
      uint32_t key = kvs__insp_rd32(e + 4), value = kvs__insp_rd32(e + 8);
      uint64_t hwcap;
      memcpy(&hwcap, e + 16, 8);
      if (pass == 0 && hwcap != 0) continue;
      if (key >= avail || value >= avail) continue;
      const char *k = (const char *)h + key, *v = (const char *)h + value;
      if (memchr(k, '\0', avail - key) == NULL || memchr(v, '\0', avail - value) == NULL) continue;
      if (strcmp(k, name) == 0 && compatible(c, v)) {
        char *p = strdup(v);
        if (p == NULL) *oom = true;
        return p;
      }
    }
  return NULL;
}

/* Finds name for requester r the way the dynamic loader does. Returns a new path and *via,
 * or NULL (not found; *oom set on ENOMEM). */
char *kvs__insp_locate(ctx_t *c, int r, const char *name, kvs_elf_via_t *via, bool *oom) {
  node_t *req = &c->nodes[r];
  char *p = NULL;
  if (strchr(name, '/') != NULL) {
    char buf[PATH_MAX];
    if (expand_dst(c, name, req->origin, buf, sizeof buf) != 0 || !compatible(c, buf)) return NULL;
    *via = KVS_ELF_VIA_PATH;
    if ((p = strdup(buf)) == NULL) *oom = true;
    return p;
  }
  /* DT_RPATH of the requester and of its loaders, unless the requester has DT_RUNPATH */
  if (req->runpath == NULL)
    for (int l = r; l >= 0 && p == NULL && !*oom; l = c->nodes[l].pub.needed_by)
      p = search_list(c, c->nodes[l].rpath, c->nodes[l].origin, name, oom);
  if (p != NULL) {
    *via = KVS_ELF_VIA_RPATH;
    return p;
  }
  /* LD_LIBRARY_PATH ($ORIGIN there is the executable's) */
  if (!*oom && (p = search_list(c, c->cfg->ld_library_path, c->nodes[0].origin, name, oom))) {
    *via = KVS_ELF_VIA_LD_LIBRARY_PATH;
    return p;
  }
  if (!*oom && (p = search_list(c, req->runpath, req->origin, name, oom))) {
    *via = KVS_ELF_VIA_RUNPATH;
    return p;
  }
  if (*oom || (req->pub.flags & KVS_ELF_OBJ_NODEFLIB)) return NULL;
  if ((p = cache_lookup(c, name, oom)) != NULL) {
    *via = KVS_ELF_VIA_CACHE;
    return p;
  }
  const char *trip = triplet_of(c->machine, c->elf_class);
  char dirs[512];
  if (trip != NULL)
    snprintf(dirs, sizeof dirs, "/lib/%s:/usr/lib/%s:/lib:/usr/lib%s", trip, trip,
             c->elf_class == ELFCLASS64 ? ":/lib64:/usr/lib64" : "");
  else
    snprintf(dirs, sizeof dirs, "/lib:/usr/lib%s",
             c->elf_class == ELFCLASS64 ? ":/lib64:/usr/lib64" : "");
  if (!*oom && (p = search_list(c, dirs, NULL, name, oom))) *via = KVS_ELF_VIA_DEFAULT;
  return p;
}

void kvs__insp_loader_free(ctx_t *c) {
  free(c->cache);
  for (size_t i = 0; i < c->n_pairs; i++) {
    free(c->pairs[i].name);
    free(c->pairs[i].path);
  }
  free(c->pairs);
}
