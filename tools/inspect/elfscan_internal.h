/* kvshim inspect: what elfscan.c (symbol facts and verdicts) and loader.c (the dynamic
 * loader's search) share. Internal to tools/inspect. */
#ifndef KVSHIM_INSPECT_ELFSCAN_INTERNAL_H
#define KVSHIM_INSPECT_ELFSCAN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "elfscan.h"

#define MAX_OBJECTS 4096 /* a closure larger than this is refused (-E2BIG) */
#define ERRBUF 256

/* What one object has to do with one hook (before verdicts). */
typedef struct facts {
  uint8_t def; /* kvs_elf_def_t; meaningful when defined != 0 */
  uint8_t defined;
  uint8_t undef_ref; /* an undefined .dynsym entry names it */
  uint8_t vis;
  uint64_t value; /* st_value of the definition */
  uint32_t jump_slot, glob_dat, other;
  int32_t direct;
  uint32_t pointers;
} facts_t;

typedef struct node {
  kvs_elf_object_t pub;
  char *origin;  /* directory substituted for $ORIGIN; NULL when unknown */
  char **needed; /* DT_NEEDED strings, n_needed of them */
  size_t n_needed;
  char *rpath, *runpath; /* raw DT_RPATH / DT_RUNPATH, or NULL */
  dev_t dev;
  ino_t ino;
  bool read; /* facts are valid */
  facts_t facts[KVS_ELF_HOOK_COUNT];
} node_t;

typedef struct cache_pair {
  char *name, *path;
} cache_pair_t;

typedef struct ctx {
  const kvs_elf_inspect_config_t *cfg;
  node_t *nodes;
  size_t n_nodes, cap_nodes;
  /* root properties every compatible library must share */
  unsigned char elf_class;
  unsigned machine;
  kvs_elf_kind_t kind;
  char *interp;
  /* the loader cache, loaded on first use */
  int cache_state;             /* 0 not loaded, 1 ld.so.cache, 2 ldconfig -p list, -1 none */
  unsigned char *cache;        /* the file */
  size_t cache_len, cache_hdr; /* offset of the "glibc-ld.so.cache" header */
  cache_pair_t *pairs;         /* from `ldconfig -p` */
  size_t n_pairs;
} ctx_t;

/* A 32-bit word of a file image, host order (no alignment needed). */
static inline uint32_t kvs__insp_rd32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* ---- loader.c: the dynamic loader's search -------------------------------------------------- */

/* Finds name for requester r the way the dynamic loader does (DT_RPATH of the requester and
 * its loaders, LD_LIBRARY_PATH, DT_RUNPATH, the ld.so cache, the default directories), keeping
 * only files compatible with the root. Returns a new path (the caller frees it) and *via, or
 * NULL (not found; *oom set on ENOMEM). */
char *kvs__insp_locate(ctx_t *c, int r, const char *name, kvs_elf_via_t *via, bool *oom);
/* The directory of path, newly allocated ("." when it has none); NULL on ENOMEM. */
char *kvs__insp_dir_of(const char *path);
/* Frees the loader cache c holds (accepts a context that never loaded it). */
void kvs__insp_loader_free(ctx_t *c);

#endif
