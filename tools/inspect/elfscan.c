/* kvshim elfscan: hook families in a binary (libelf, offline) or in this process (in memory).
 * See elfscan.h for the interposition rules the verdicts encode. */
#include "elfscan.h"
#include "elfscan_internal.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <limits.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ==== tables =============================================================================== */

#define ONE_(ret, name, params, args) +1
#define SIZE_(id, name, title, rows) (0 rows(ONE_)),
/* Hooks per family; a family's hooks follow those of the families before it. */
static const unsigned char family_sizes[KVS_ELF_FAMILY_COUNT] = {KVS_HOOK_FAMILIES(SIZE_)};
#define MAX_(id, name, title, rows)                                                           \
  _Static_assert((0 rows(ONE_)) <= KVS_ELF_FAMILY_MAX_HOOKS, #id " family too large");
KVS_HOOK_FAMILIES(MAX_)
#undef MAX_
#undef SIZE_
#undef ONE_

static const char *const hook_names[KVS_ELF_HOOK_COUNT] = {
#define NAME_(ret, name, params, args) #name,
#define FNAMES_(id, name, title, rows) rows(NAME_)
    KVS_HOOK_FAMILIES(FNAMES_)
#undef FNAMES_
#undef NAME_
};
static const char *const family_names[KVS_ELF_FAMILY_COUNT] = {
#define FNAME_(id, name, title, rows) #name,
    KVS_HOOK_FAMILIES(FNAME_)
#undef FNAME_
};
static const char *const family_titles[KVS_ELF_FAMILY_COUNT] = {
#define FTITLE_(id, name, title, rows) title,
    KVS_HOOK_FAMILIES(FTITLE_)
#undef FTITLE_
};
static const char *const reason_names[KVS_ELF_REASON_COUNT] = {
#define RNAME_(id, name, text) name,
    KVS_ELF_REASONS(RNAME_)
#undef RNAME_
};
static const char *const reason_texts[KVS_ELF_REASON_COUNT] = {
#define RTEXT_(id, name, text) text,
    KVS_ELF_REASONS(RTEXT_)
#undef RTEXT_
};

const char *kvs_elf_family_name(kvs_elf_family_t f) {
  return (unsigned)f < KVS_ELF_FAMILY_COUNT ? family_names[f] : "?";
}
const char *kvs_elf_family_title(kvs_elf_family_t f) {
  return (unsigned)f < KVS_ELF_FAMILY_COUNT ? family_titles[f] : "?";
}
const char *kvs_elf_hook_name(kvs_elf_hook_t h) {
  return (unsigned)h < KVS_ELF_HOOK_COUNT ? hook_names[h] : "?";
}
kvs_elf_family_t kvs_elf_hook_family(kvs_elf_hook_t h) {
  unsigned f = 0, end = 0;
  for (; f < KVS_ELF_FAMILY_COUNT; f++)
    if ((unsigned)h < (end += family_sizes[f])) break;
  return (kvs_elf_family_t)f; /* KVS_ELF_FAMILY_COUNT when out of range */
}
const char *kvs_elf_reason_name(kvs_elf_reason_t r) {
  return (unsigned)r < KVS_ELF_REASON_COUNT ? reason_names[r] : "?";
}
const char *kvs_elf_reason_text(kvs_elf_reason_t r) {
  return (unsigned)r < KVS_ELF_REASON_COUNT ? reason_texts[r] : "?";
}
static const char *const verdict_names[] = {
    [KVS_ELF_ABSENT] = "absent", [KVS_ELF_YES] = "yes", [KVS_ELF_PARTIAL] = "partial",
    [KVS_ELF_NO] = "no"};
static const char *const kind_names[] = {
    [KVS_ELF_KIND_EXEC] = "executable", [KVS_ELF_KIND_PIE] = "pie-executable",
    [KVS_ELF_KIND_SHARED] = "shared-library", [KVS_ELF_KIND_STATIC] = "static-executable",
    [KVS_ELF_KIND_STATIC_PIE] = "static-pie-executable"};
static const char *const via_names[] = {
    [KVS_ELF_VIA_ARGUMENT] = "argument", [KVS_ELF_VIA_PATH] = "path",
    [KVS_ELF_VIA_RPATH] = "rpath", [KVS_ELF_VIA_LD_LIBRARY_PATH] = "LD_LIBRARY_PATH",
    [KVS_ELF_VIA_RUNPATH] = "runpath", [KVS_ELF_VIA_CACHE] = "ld.so.cache",
    [KVS_ELF_VIA_DEFAULT] = "default", [KVS_ELF_VIA_NOT_FOUND] = "not found"};
#define NAMES_N(a) (sizeof(a) / sizeof(a)[0])
_Static_assert(NAMES_N(verdict_names) == KVS_ELF_NO + 1, "a verdict without a name");
_Static_assert(NAMES_N(kind_names) == KVS_ELF_KIND_STATIC_PIE + 1, "a kind without a name");
_Static_assert(NAMES_N(via_names) == KVS_ELF_VIA_NOT_FOUND + 1, "a route without a name");

/* names[v], or "?" out of range. */
static const char *name_of(const char *const *names, size_t n, unsigned v) {
  return v < n && names[v] ? names[v] : "?";
}
const char *kvs_elf_verdict_name(kvs_elf_verdict_t v) {
  return name_of(verdict_names, NAMES_N(verdict_names), (unsigned)v);
}
const char *kvs_elf_kind_name(kvs_elf_kind_t k) {
  return name_of(kind_names, NAMES_N(kind_names), (unsigned)k);
}
const char *kvs_elf_via_name(kvs_elf_via_t v) {
  return name_of(via_names, NAMES_N(via_names), (unsigned)v);
}

int kvs_elf_family_hooks(kvs_elf_family_t f, kvs_elf_hook_t *first, unsigned *count) {
  if ((unsigned)f >= KVS_ELF_FAMILY_COUNT || first == NULL || count == NULL) return -EINVAL;
  unsigned lo = 0;
  for (unsigned k = 0; k < (unsigned)f; k++) lo += family_sizes[k];
  *first = (kvs_elf_hook_t)lo;
  *count = family_sizes[f];
  return 0;
}

/* The hook whose name is the NUL-terminated s, or -1. Cheap reject on the first byte (the
 * first bytes of the hook names, learnt from them once): this runs for every dynamic symbol of
 * every object. */
static int hook_of(const char *s) {
  static _Atomic(bool) learnt;
  static _Atomic(bool) first[256];
  if (!atomic_load_explicit(&learnt, memory_order_acquire)) {
    for (unsigned h = 0; h < KVS_ELF_HOOK_COUNT; h++)
      atomic_store_explicit(&first[(unsigned char)hook_names[h][0]], true, memory_order_relaxed);
    atomic_store_explicit(&learnt, true, memory_order_release);
  }
  if (!atomic_load_explicit(&first[(unsigned char)s[0]], memory_order_relaxed)) return -1;
  for (unsigned h = 0; h < KVS_ELF_HOOK_COUNT; h++)
    if (strcmp(s, hook_names[h]) == 0) return (int)h;
  return -1;
}

int kvs_elf_hook_find(const char *name, kvs_elf_hook_t *out) {
  if (name == NULL || out == NULL) return -EINVAL;
  int h = hook_of(name);
  if (h < 0) return -ENOENT;
  *out = (kvs_elf_hook_t)h;
  return 0;
}

int kvs_elf_summary_line(char *buf, size_t n, const char *title, const char *definer, unsigned yes,
                         unsigned present) {
  if (buf == NULL && n > 0) return -EINVAL;
  return snprintf(buf, n, "%s: %s, %u/%u hooks interposable", title ? title : "?",
                  definer && definer[0] ? definer : "no definition", yes, present);
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* ==== offline: libelf ======================================================================= */

static void seterr(char *err, size_t n, const char *fmt, const char *a, const char *b) {
  if (err != NULL && n > 0) snprintf(err, n, fmt, a, b ? b : "");
}

/* ---- reading one object ------------------------------------------------------------------- */

typedef enum rkind { R_PLT, R_GOT, R_REL, R_OTHER, R_NONE } rkind_t;

static rkind_t reloc_kind(unsigned machine, unsigned type) {
  switch (machine) {
  case EM_X86_64:
    return type == R_X86_64_JUMP_SLOT  ? R_PLT
           : type == R_X86_64_GLOB_DAT ? R_GOT
           : type == R_X86_64_RELATIVE ? R_REL
           : type == R_X86_64_NONE     ? R_NONE
                                       : R_OTHER;
  case EM_386:
    return type == R_386_JMP_SLOT   ? R_PLT
           : type == R_386_GLOB_DAT ? R_GOT
           : type == R_386_RELATIVE ? R_REL
           : type == R_386_NONE     ? R_NONE
                                    : R_OTHER;
  case EM_AARCH64:
    return type == R_AARCH64_JUMP_SLOT  ? R_PLT
           : type == R_AARCH64_GLOB_DAT ? R_GOT
           : type == R_AARCH64_RELATIVE ? R_REL
           : type == R_AARCH64_NONE     ? R_NONE
                                        : R_OTHER;
  default: return type == 0 ? R_NONE : R_OTHER;
  }
}

typedef struct target {
  uint64_t addr;
  unsigned hook;
} target_t;

static int target_cmp(const void *a, const void *b) {
  const target_t *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int target_find(const target_t *t, size_t n, uint64_t addr) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (t[mid].addr < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && t[lo].addr == addr ? (int)lo : -1;
}

/* Counts direct call/jump instructions to each definition: x86 call/jmp rel32 (e8/e9),
 * aarch64 bl/b imm26. A byte-wise x86 scan can also match inside other instructions; a
 * match needs the 32-bit displacement to land exactly on a hook's entry, which keeps false
 * hits rare (about one per 2^32 / hooks e8/e9 bytes). */
static void scan_code(node_t *nd, Elf *elf, unsigned machine) {
  target_t t[KVS_ELF_HOOK_COUNT];
  size_t nt = 0;
  for (unsigned h = 0; h < KVS_ELF_HOOK_COUNT; h++)
    if (nd->facts[h].defined && nd->facts[h].value != 0)
      t[nt++] = (target_t){nd->facts[h].value, h};
  if (nt == 0) return;
  bool x86 = machine == EM_X86_64 || machine == EM_386, a64 = machine == EM_AARCH64;
  if (!x86 && !a64) {
    nd->pub.flags |= KVS_ELF_OBJ_NO_CODE_SCAN;
    for (size_t i = 0; i < nt; i++) nd->facts[t[i].hook].direct = -1;
    return;
  }
  qsort(t, nt, sizeof t[0], target_cmp);
  Elf_Scn *scn = NULL;
  while ((scn = elf_nextscn(elf, scn)) != NULL) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == NULL || !(sh.sh_flags & SHF_EXECINSTR) ||
        sh.sh_type == SHT_NOBITS)
      continue;
    Elf_Data *d = elf_rawdata(scn, NULL);
    if (d == NULL || d->d_buf == NULL) continue;
    const unsigned char *b = d->d_buf;
    size_t n = d->d_size;
    if (x86) {
      for (size_t i = 0; i + 5 <= n; i++) {
        if (b[i] != 0xe8 && b[i] != 0xe9) continue;
        int32_t rel;
        memcpy(&rel, b + i + 1, 4);
        uint64_t to = sh.sh_addr + i + 5 + (uint64_t)(int64_t)rel;
        if (machine == EM_386) to &= 0xffffffffu;
        int k = target_find(t, nt, to);
        if (k >= 0) nd->facts[t[k].hook].direct++;
      }
    } else {
      for (size_t i = 0; i + 4 <= n; i += 4) {
        uint32_t w = kvs__insp_rd32(b + i);
        if ((w & 0x7c000000u) != 0x14000000u) continue;
        int64_t imm = (int64_t)(w & 0x03ffffffu);
        if (imm & 0x02000000) imm -= 0x04000000;
        int k = target_find(t, nt, sh.sh_addr + i + (uint64_t)(imm * 4));
        if (k >= 0) nd->facts[t[k].hook].direct++;
      }
    }
  }
}

/* Reads the symbols of one symbol table section into facts. dynamic: .dynsym (else .symtab).
 * map (optional, n_syms entries): symbol index -> hook or -1. */
static int read_syms(node_t *nd, Elf *elf, Elf_Scn *scn, bool dynamic, int16_t **map,
                     size_t *n_map) {
  GElf_Shdr sh;
  Elf_Data *d;
  if (gelf_getshdr(scn, &sh) == NULL || sh.sh_entsize == 0 || (d = elf_getdata(scn, NULL)) == NULL)
    return -EPROTONOSUPPORT;
  size_t n = sh.sh_size / sh.sh_entsize;
  int16_t *m = NULL;
  if (map != NULL) {
    m = malloc((n ? n : 1) * sizeof *m);
    if (m == NULL) return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    GElf_Sym s;
    if (m) m[i] = -1;
    if (gelf_getsym(d, (int)i, &s) == NULL) continue;
    const char *name = elf_strptr(elf, sh.sh_link, s.st_name);
    if (name == NULL) continue;
    int h = hook_of(name);
    if (h < 0) continue;
    if (m) m[i] = (int16_t)h;
    facts_t *f = &nd->facts[h];
    unsigned vis = GELF_ST_VISIBILITY(s.st_other), bind = GELF_ST_BIND(s.st_info);
    if (s.st_shndx == SHN_UNDEF) {
      if (dynamic) f->undef_ref = 1;
      continue;
    }
    if (f->defined && (f->def == KVS_ELF_DEF_EXPORTED || !dynamic)) continue;
    bool exported = dynamic && bind != STB_LOCAL && (vis == STV_DEFAULT || vis == STV_PROTECTED);
    f->defined = 1;
    f->def = exported ? KVS_ELF_DEF_EXPORTED : KVS_ELF_DEF_INTERNAL;
    f->vis = (uint8_t)(bind == STB_LOCAL ? KVS_ELF_VIS_LOCAL : vis);
    f->value = s.st_value;
  }
  if (map) {
    *map = m;
    *n_map = n;
  }
  return 0;
}

static void read_relocs(node_t *nd, Elf_Scn *scn, unsigned machine, const int16_t *map,
                        size_t n_map) {
  GElf_Shdr sh;
  Elf_Data *d;
  if (gelf_getshdr(scn, &sh) == NULL || sh.sh_entsize == 0 || (d = elf_getdata(scn, NULL)) == NULL)
    return;
  size_t n = sh.sh_size / sh.sh_entsize;
  bool rela = sh.sh_type == SHT_RELA;
  for (size_t i = 0; i < n; i++) {
    uint64_t info;
    int64_t addend = 0;
    if (rela) {
      GElf_Rela r;
      if (gelf_getrela(d, (int)i, &r) == NULL) continue;
      info = r.r_info;
      addend = r.r_addend;
    } else {
      GElf_Rel r;
      if (gelf_getrel(d, (int)i, &r) == NULL) continue;
      info = r.r_info;
    }
    size_t sym = GELF_R_SYM(info);
    rkind_t k = reloc_kind(machine, (unsigned)GELF_R_TYPE(info));
    if (k == R_NONE) continue;
    if (sym == 0) {
      if (k != R_REL || !rela) continue;
      for (unsigned h = 0; h < KVS_ELF_HOOK_COUNT; h++)
        if (nd->facts[h].defined && nd->facts[h].value != 0 &&
            nd->facts[h].value == (uint64_t)addend)
          nd->facts[h].pointers++;
      continue;
    }
    if (sym >= n_map || map[sym] < 0) continue;
    facts_t *f = &nd->facts[map[sym]];
    if (k == R_PLT)
      f->jump_slot++;
    else if (k == R_GOT)
      f->glob_dat++;
    else
      f->other++;
  }
}

/* The kind of the root from its headers. */
static kvs_elf_kind_t kind_of(unsigned type, bool interp, bool pie_flag, bool soname) {
  if (type == ET_EXEC) return interp ? KVS_ELF_KIND_EXEC : KVS_ELF_KIND_STATIC;
  if (pie_flag) return interp ? KVS_ELF_KIND_PIE : KVS_ELF_KIND_STATIC_PIE;
  if (soname) return KVS_ELF_KIND_SHARED;
  return interp ? KVS_ELF_KIND_PIE : KVS_ELF_KIND_SHARED;
}

/* Opens and reads node nd (its pub.path). root: also fixes the class, machine and kind. */
static int read_object(ctx_t *c, node_t *nd, bool root, char *err, size_t err_len) {
  const char *path = nd->pub.path;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* never wait on a FIFO */
  if (fd < 0) {
    int e = errno;
    seterr(err, err_len, "%s: %s", path, strerror(e));
    return -e;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
    close(fd);
    seterr(err, err_len, "%s: %s", path, strerror(e));
    return -e;
  }
  nd->dev = st.st_dev;
  nd->ino = st.st_ino;
  int rc = 0;
  int16_t *map = NULL;
  size_t n_map = 0;
  if (!S_ISREG(st.st_mode)) {
    seterr(err, err_len, "%s: not a regular file%s", path, "");
    rc = -ENOEXEC;
    goto out_fd;
  }
  Elf *elf = st.st_size > 0 ? elf_begin(fd, ELF_C_READ_MMAP, NULL) : NULL;
  GElf_Ehdr eh;
  if (elf == NULL || elf_kind(elf) != ELF_K_ELF) {
    seterr(err, err_len, "%s: not an ELF file%s", path, "");
    rc = -ENOEXEC;
    goto out;
  }
  if (gelf_getehdr(elf, &eh) == NULL) {
    seterr(err, err_len, "%s: malformed ELF file: %s", path, elf_errmsg(-1));
    rc = -EPROTONOSUPPORT;
    goto out;
  }
  /* counts from the header itself: libelf clamps them to what the file holds */
  size_t n_ph = eh.e_phnum, n_sh = eh.e_shnum;
  if ((n_ph == PN_XNUM && elf_getphdrnum(elf, &n_ph) != 0) ||
      (n_sh == 0 && eh.e_shoff != 0 && elf_getshdrnum(elf, &n_sh) != 0) ||
      (n_ph && (eh.e_phoff > (uint64_t)st.st_size ||
                (uint64_t)n_ph * eh.e_phentsize > (uint64_t)st.st_size - eh.e_phoff)) ||
      (n_sh && (eh.e_shoff > (uint64_t)st.st_size ||
                (uint64_t)n_sh * eh.e_shentsize > (uint64_t)st.st_size - eh.e_shoff))) {
    seterr(err, err_len,
           "%s: truncated or malformed ELF file (its headers lie beyond the end "
           "of the file)%s",
           path, "");
    rc = -EPROTONOSUPPORT;
    goto out;
  }
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN) {
    seterr(err, err_len, "%s: %s", path,
           eh.e_type == ET_REL
               ? "an ELF relocatable object (.o), not an executable or shared library"
           : eh.e_type == ET_CORE ? "an ELF core dump, not an executable or shared library"
                                  : "an ELF file that is not an executable or shared library");
    rc = -ENOEXEC;
    goto out;
  }
  if (root) {
    c->elf_class = (unsigned char)gelf_getclass(elf);
    c->machine = eh.e_machine;
  }
  /* program headers: the interpreter */
  bool has_interp = false;
  {
    for (size_t i = 0; i < n_ph; i++) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, (int)i, &ph) == NULL || ph.p_type != PT_INTERP) continue;
      has_interp = true;
      size_t flen = 0;
      const char *raw = elf_rawfile(elf, &flen);
      if (root && raw && ph.p_offset < flen && ph.p_filesz <= flen - ph.p_offset &&
          ph.p_filesz > 0) {
        free(c->interp);
        c->interp = strndup(raw + ph.p_offset, ph.p_filesz);
      }
    }
  }
  /* sections */
  Elf_Scn *scn = NULL, *dynsym = NULL, *symtab = NULL;
  size_t dynsym_idx = 0;
  bool pie_flag = false;
  while ((scn = elf_nextscn(elf, scn)) != NULL) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == NULL) continue;
    if (sh.sh_type == SHT_DYNSYM) {
      dynsym = scn;
      dynsym_idx = elf_ndxscn(scn);
    } else if (sh.sh_type == SHT_SYMTAB) {
      symtab = scn;
    } else if (sh.sh_type == SHT_DYNAMIC) {
      Elf_Data *d = elf_getdata(scn, NULL);
      size_t n = d && sh.sh_entsize ? sh.sh_size / sh.sh_entsize : 0;
      for (size_t i = 0; i < n && rc == 0; i++) {
        GElf_Dyn dy;
        if (gelf_getdyn(d, (int)i, &dy) == NULL || dy.d_tag == DT_NULL) break;
        const char *s = NULL;
        if (dy.d_tag == DT_NEEDED || dy.d_tag == DT_RPATH || dy.d_tag == DT_RUNPATH ||
            dy.d_tag == DT_SONAME) {
          s = elf_strptr(elf, sh.sh_link, dy.d_un.d_val);
          if (s == NULL) continue;
        }
        switch (dy.d_tag) {
        case DT_NEEDED: {
          char **nn = realloc(nd->needed, (nd->n_needed + 1) * sizeof *nn);
          if (nn == NULL || (nn[nd->n_needed] = strdup(s)) == NULL) {
            if (nn) nd->needed = nn;
            rc = -ENOMEM;
            break;
          }
          nd->needed = nn;
          nd->n_needed++;
          break;
        }
        case DT_RPATH:
          free(nd->rpath);
          nd->rpath = strdup(s);
          if (!nd->rpath) rc = -ENOMEM;
          break;
        case DT_RUNPATH:
          free(nd->runpath);
          nd->runpath = strdup(s);
          if (!nd->runpath) rc = -ENOMEM;
          break;
        case DT_SONAME:
          free(nd->pub.soname);
          nd->pub.soname = strdup(s);
          if (!nd->pub.soname) rc = -ENOMEM;
          break;
        case DT_SYMBOLIC: nd->pub.flags |= KVS_ELF_OBJ_SYMBOLIC; break;
        case DT_FLAGS:
          if (dy.d_un.d_val & DF_SYMBOLIC) nd->pub.flags |= KVS_ELF_OBJ_SYMBOLIC;
          break;
        case DT_FLAGS_1:
          if (dy.d_un.d_val & DF_1_NODEFLIB) nd->pub.flags |= KVS_ELF_OBJ_NODEFLIB;
          if (dy.d_un.d_val & DF_1_PIE) pie_flag = true;
          break;
        default: break;
        }
      }
      if (rc != 0) goto out;
    }
  }
  if (root) c->kind = kind_of(eh.e_type, has_interp, pie_flag, nd->pub.soname != NULL);
  /* symbols: exported definitions and imports first, then what only .symtab knows */
  if (dynsym != NULL && (rc = read_syms(nd, elf, dynsym, true, &map, &n_map)) < 0) {
    if (rc == -ENOMEM) goto out;
    rc = 0;
  }
  if (symtab != NULL && (rc = read_syms(nd, elf, symtab, false, NULL, NULL)) < 0) {
    if (rc == -ENOMEM) goto out;
    rc = 0;
  }
  /* dynamic relocations (those whose symbols are in .dynsym) */
  if (map != NULL) {
    scn = NULL;
    while ((scn = elf_nextscn(elf, scn)) != NULL) {
      GElf_Shdr sh;
      if (gelf_getshdr(scn, &sh) == NULL) continue;
      if ((sh.sh_type == SHT_RELA || sh.sh_type == SHT_REL) && sh.sh_link == dynsym_idx)
        read_relocs(nd, scn, eh.e_machine, map, n_map);
    }
  }
  scan_code(nd, elf, eh.e_machine);
  nd->read = true;
out:
  free(map);
  if (elf) elf_end(elf);
out_fd:
  close(fd);
  return rc;
}

/* ---- the closure --------------------------------------------------------------------------- */

static int add_node(ctx_t *c, const char *name, char *path, kvs_elf_via_t via, int needed_by,
                    int *idx) {
  if (c->n_nodes >= MAX_OBJECTS) {
    free(path);
    return -E2BIG;
  }
  if (c->n_nodes == c->cap_nodes) {
    size_t cap = c->cap_nodes ? c->cap_nodes * 2 : 16;
    node_t *nn = realloc(c->nodes, cap * sizeof *nn);
    if (nn == NULL) {
      free(path);
      return -ENOMEM;
    }
    c->nodes = nn;
    c->cap_nodes = cap;
  }
  node_t *nd = &c->nodes[c->n_nodes];
  memset(nd, 0, sizeof *nd);
  nd->pub.name = strdup(name);
  nd->pub.path = path;
  nd->pub.via = via;
  nd->pub.needed_by = needed_by;
  c->n_nodes++;
  if (nd->pub.name == NULL) return -ENOMEM;
  *idx = (int)(c->n_nodes - 1);
  return 0;
}

/* Adds the objects DT_NEEDED of node r names, unless already loaded. */
static int resolve_needed(ctx_t *c, int r) {
  for (size_t k = 0; k < c->nodes[r].n_needed; k++) {
    const char *name = c->nodes[r].needed[k];
    bool loaded = false;
    for (size_t i = 0; i < c->n_nodes && !loaded; i++) {
      const node_t *o = &c->nodes[i];
      loaded =
          strcmp(o->pub.name, name) == 0 || (o->pub.soname && strcmp(o->pub.soname, name) == 0);
    }
    if (loaded) continue;
    kvs_elf_via_t via = KVS_ELF_VIA_NOT_FOUND;
    bool oom = false;
    char *path = kvs__insp_locate(c, r, name, &via, &oom);
    if (oom) {
      free(path);
      return -ENOMEM;
    }
    if (path != NULL) {
      struct stat st;
      bool same = false;
      if (stat(path, &st) == 0)
        for (size_t i = 0; i < c->n_nodes && !same; i++)
          same =
              c->nodes[i].pub.path && c->nodes[i].dev == st.st_dev && c->nodes[i].ino == st.st_ino;
      if (same) {
        free(path);
        continue;
      }
    }
    int idx;
    int rc = add_node(c, name, path, path ? via : KVS_ELF_VIA_NOT_FOUND, r, &idx);
    if (rc < 0) return rc;
    if (path != NULL) {
      node_t *nd = &c->nodes[idx];
      if ((nd->origin = kvs__insp_dir_of(path)) == NULL) return -ENOMEM;
      char why[ERRBUF];
      rc = read_object(c, nd, false, why, sizeof why);
      if (rc == -ENOMEM) return rc;
      if (rc < 0 && (nd->pub.error = strdup(why)) == NULL) return -ENOMEM;
    }
  }
  return 0;
}

/* ---- verdicts ------------------------------------------------------------------------------ */

static bool is_static(kvs_elf_kind_t k) {
  return k == KVS_ELF_KIND_STATIC || k == KVS_ELF_KIND_STATIC_PIE;
}
static bool is_exec(kvs_elf_kind_t k) { return k == KVS_ELF_KIND_EXEC || k == KVS_ELF_KIND_PIE; }

/* Why calls inside definer i to hook h would be bound (the reason if they are). */
static kvs_elf_reason_t bound_reason(const ctx_t *c, size_t i, const facts_t *f) {
  if (is_static(c->kind)) return KVS_ELF_REASON_STATIC;
  if (i == 0 && is_exec(c->kind)) return KVS_ELF_REASON_EXECUTABLE;
  if (f->def == KVS_ELF_DEF_INTERNAL) return KVS_ELF_REASON_HIDDEN;
  if (f->vis == STV_PROTECTED) return KVS_ELF_REASON_PROTECTED;
  if (c->nodes[i].pub.flags & KVS_ELF_OBJ_SYMBOLIC) return KVS_ELF_REASON_SYMBOLIC;
  return KVS_ELF_REASON_SYMBOLIC_FUNCTIONS;
}

static int judge(const ctx_t *c, kvs_elf_symbol_t *s) {
  unsigned h = s->hook;
  size_t n = 0;
  s->definer = -1;
  for (size_t i = 0; i < c->n_nodes; i++) {
    const facts_t *f = &c->nodes[i].facts[h];
    if (!c->nodes[i].read) continue;
    if (f->defined || f->undef_ref || f->jump_slot || f->glob_dat || f->other) n++;
    if (s->definer < 0 && f->defined && f->def == KVS_ELF_DEF_EXPORTED) s->definer = (int)i;
  }
  s->verdict = KVS_ELF_ABSENT;
  s->reason = KVS_ELF_REASON_NONE;
  if (n == 0) return 0;
  s->uses = calloc(n, sizeof *s->uses);
  if (s->uses == NULL) return -ENOMEM;
  bool exe_def = s->definer == 0 && is_exec(c->kind);
  unsigned ok = 0, bad = 0;
  kvs_elf_reason_t first_bad = KVS_ELF_REASON_NONE, def_reason = KVS_ELF_REASON_NONE;
  bool def_ok = false, any_def = false;
  for (size_t i = 0; i < c->n_nodes; i++) {
    const facts_t *f = &c->nodes[i].facts[h];
    if (!c->nodes[i].read ||
        !(f->defined || f->undef_ref || f->jump_slot || f->glob_dat || f->other))
      continue;
    kvs_elf_use_t *u = &s->uses[s->n_uses++];
    u->object = (uint32_t)i;
    u->jump_slot = f->jump_slot;
    u->glob_dat = f->glob_dat;
    u->other_relocs = f->other;
    unsigned relocs = f->jump_slot + f->glob_dat + f->other;
    kvs_elf_reason_t why = KVS_ELF_REASON_NONE;
    bool route;
    if (!f->defined) { /* an import: bound by the loader in the global order */
      u->def = KVS_ELF_DEF_NONE;
      why = is_static(c->kind) ? KVS_ELF_REASON_STATIC
            : exe_def          ? KVS_ELF_REASON_EXECUTABLE
                               : KVS_ELF_REASON_NONE;
      route = true;
    } else {
      u->def = f->def;
      u->visibility = f->vis;
      u->direct_calls = f->direct;
      u->pointers = f->pointers;
      kvs_elf_reason_t b = bound_reason(c, i, f);
      bool relocs_bound = relocs > 0 && b != KVS_ELF_REASON_SYMBOLIC_FUNCTIONS;
      if (f->direct > 0 || relocs_bound) why = b;
      route = f->direct > 0 || relocs > 0;
      /* what a definition alone means for callers elsewhere */
      kvs_elf_reason_t alone =
          (is_static(c->kind) || (i == 0 && is_exec(c->kind)) || f->def == KVS_ELF_DEF_INTERNAL)
              ? b
              : KVS_ELF_REASON_NONE;
      if (!any_def || (int)i == s->definer) {
        def_ok = alone == KVS_ELF_REASON_NONE;
        def_reason = alone;
        any_def = true;
      }
      if (!route && alone != KVS_ELF_REASON_NONE) why = alone;
    }
    u->interposable = why == KVS_ELF_REASON_NONE;
    u->reason = (uint8_t)why;
    if (!route) continue;
    if (u->interposable)
      ok++;
    else if (bad++ == 0)
      first_bad = why;
  }
  if (ok + bad == 0) {
    /* definitions only, reached by no relocation: LD_PRELOAD sees no call to it */
    s->verdict = KVS_ELF_NO;
    s->reason = def_ok || !any_def ? KVS_ELF_REASON_UNREACHED : def_reason;
  } else if (bad == 0) {
    s->verdict = KVS_ELF_YES;
  } else {
    s->verdict = ok == 0 ? KVS_ELF_NO : KVS_ELF_PARTIAL;
    s->reason = first_bad;
  }
  return 0;
}

/* ---- report -------------------------------------------------------------------------------- */

static void node_free(node_t *nd) {
  free(nd->origin);
  for (size_t k = 0; k < nd->n_needed; k++) free(nd->needed[k]);
  free(nd->needed);
  free(nd->rpath);
  free(nd->runpath);
}

static void ctx_free(ctx_t *c, bool keep_pub) {
  for (size_t i = 0; i < c->n_nodes; i++) {
    node_free(&c->nodes[i]);
    if (!keep_pub) {
      free(c->nodes[i].pub.name);
      free(c->nodes[i].pub.path);
      free(c->nodes[i].pub.soname);
      free(c->nodes[i].pub.error);
    }
  }
  free(c->nodes);
  kvs__insp_loader_free(c);
  if (!keep_pub) free(c->interp);
}

void kvs_elf_report_destroy(kvs_elf_report_t *r) {
  if (r == NULL) return;
  for (size_t i = 0; i < r->n_objects; i++) {
    free(r->objects[i].name);
    free(r->objects[i].path);
    free(r->objects[i].soname);
    free(r->objects[i].error);
  }
  free(r->objects);
  for (unsigned h = 0; h < KVS_ELF_HOOK_COUNT; h++) free(r->symbols[h].uses);
  free(r->interp);
#ifdef KVSHIM_DEBUG
  memset(r, 0xa5, sizeof *r);
#endif
  free(r);
}

static int elf_ready(void) {
  static int state; /* 0 unknown, 1 ok, -1 failed; elf_version is idempotent, a race is benign */
  if (state == 0) state = elf_version(EV_CURRENT) == EV_NONE ? -1 : 1;
  return state;
}

int kvs_elf_inspect(const char *path, const kvs_elf_inspect_config_t *cfg, kvs_elf_report_t **out,
                    char *err, size_t err_len) {
  static const kvs_elf_inspect_config_t defaults = {0};
  if (err != NULL && err_len > 0) err[0] = '\0';
  if (path == NULL || out == NULL) {
    seterr(err, err_len, "no binary given%s%s", "", "");
    return -EINVAL;
  }
  if (elf_ready() < 0) {
    seterr(err, err_len, "libelf: %s%s", elf_errmsg(-1), "");
    return -EPROTONOSUPPORT;
  }
  ctx_t c;
  memset(&c, 0, sizeof c);
  c.cfg = cfg ? cfg : &defaults;
  int idx, rc;
  char *p = strdup(path);
  if (p == NULL) {
    rc = -ENOMEM;
    goto fail;
  }
  if ((rc = add_node(&c, path, p, KVS_ELF_VIA_ARGUMENT, -1, &idx)) < 0) goto fail;
  if ((rc = read_object(&c, &c.nodes[0], true, err, err_len)) < 0) goto fail;
  /* $ORIGIN of the executable is where its file really is (the loader reads /proc/self/exe);
   * a library's is the directory of the path it was opened by. */
  char real[PATH_MAX];
  c.nodes[0].origin = is_exec(c.kind) && realpath(path, real) ? kvs__insp_dir_of(real) : kvs__insp_dir_of(path);
  if (c.nodes[0].origin == NULL) {
    rc = -ENOMEM;
    goto fail;
  }
  if (!is_static(c.kind))
    for (size_t i = 0; i < c.n_nodes; i++)
      if (c.nodes[i].read && (rc = resolve_needed(&c, (int)i)) < 0) {
        seterr(err, err_len, "%s: %s", path,
               rc == -E2BIG ? "its closure has too many objects" : strerror(-rc));
        goto fail;
      }
  kvs_elf_report_t *r = calloc(1, sizeof *r);
  if (r == NULL) {
    rc = -ENOMEM;
    goto fail;
  }
  for (unsigned h = 0; h < KVS_ELF_HOOK_COUNT; h++) {
    r->symbols[h].hook = (kvs_elf_hook_t)h;
    if ((rc = judge(&c, &r->symbols[h])) < 0) {
      for (unsigned k = 0; k <= h; k++) free(r->symbols[k].uses);
      free(r);
      goto fail;
    }
  }
  r->objects = calloc(c.n_nodes, sizeof *r->objects);
  if (r->objects == NULL) {
    for (unsigned k = 0; k < KVS_ELF_HOOK_COUNT; k++) free(r->symbols[k].uses);
    free(r);
    rc = -ENOMEM;
    goto fail;
  }
  for (size_t i = 0; i < c.n_nodes; i++) r->objects[i] = c.nodes[i].pub;
  r->n_objects = c.n_nodes;
  r->kind = c.kind;
  r->interp = c.interp;
  r->machine = c.machine;
  ctx_free(&c, true);
  *out = r;
  return 0;
fail:
  if (rc == -ENOMEM) seterr(err, err_len, "%s: out of memory%s", path, "");
  ctx_free(&c, false);
  return rc;
}

int kvs_elf_family_summarize(const kvs_elf_report_t *r, kvs_elf_family_t f,
                             kvs_elf_family_summary_t *out) {
  kvs_elf_hook_t first;
  unsigned count;
  if (r == NULL || out == NULL || kvs_elf_family_hooks(f, &first, &count) < 0) return -EINVAL;
  kvs_elf_family_summary_t s = {.definer = -1};
  unsigned best = 0;
  for (unsigned k = 0; k < count; k++) {
    const kvs_elf_symbol_t *sym = &r->symbols[first + k];
    switch (sym->verdict) {
    case KVS_ELF_ABSENT: continue;
    case KVS_ELF_YES: s.yes++; break;
    case KVS_ELF_PARTIAL: s.partial++; break;
    case KVS_ELF_NO: s.no++; break;
    }
    s.present++;
  }
  for (size_t i = 0; i < r->n_objects; i++) {
    unsigned defs = 0;
    for (unsigned k = 0; k < count; k++) {
      const kvs_elf_symbol_t *sym = &r->symbols[first + k];
      for (size_t u = 0; u < sym->n_uses; u++)
        if (sym->uses[u].object == i && sym->uses[u].def != KVS_ELF_DEF_NONE) defs++;
    }
    if (defs == 0) continue;
    s.n_definers++;
    if (defs > best) {
      best = defs;
      s.definer = (int)i;
    }
  }
  *out = s;
  return 0;
}

/* ---- features ------------------------------------------------------------------------------ */

#define H_(name) KVS_ELF_HOOK_##name
#define FEATURE_NEEDS_MAX 12
/* The hooks each feature cannot work without. all: each one, interposable (the prefix cache
 * registers a context in llama_init_from_model, restores in llama_decode, and knows a model only
 * through the fingerprint taken in llama_model_load_from_file, shims/llama/prefix.c). any: at
 * least one of them, interposable (the state adapter serves whichever state call the engine
 * makes, shims/llama/llama.c). Each list ends at its KVS_ELF_HOOK_COUNT. */
static const struct {
  kvs_elf_hook_t all[4], any[FEATURE_NEEDS_MAX];
} feature_needs[KVS_ELF_FEATURE_COUNT] = {
    [KVS_ELF_FEATURE_LLAMA_STATE] = {{H_(llama_model_load_from_file), KVS_ELF_HOOK_COUNT},
                                     {H_(llama_state_seq_save_file), H_(llama_state_seq_load_file),
                                      H_(llama_state_seq_get_data), H_(llama_state_seq_get_data_ext),
                                      H_(llama_state_seq_set_data), H_(llama_state_seq_set_data_ext),
                                      H_(llama_state_save_file), H_(llama_state_load_file),
                                      KVS_ELF_HOOK_COUNT}},
    [KVS_ELF_FEATURE_LLAMA_PREFIX] = {{H_(llama_decode), H_(llama_init_from_model),
                                       H_(llama_model_load_from_file), KVS_ELF_HOOK_COUNT},
                                      {KVS_ELF_HOOK_COUNT}},
};
#undef H_

static const struct {
  const char *name, *lost;
  kvs_elf_family_t family;
} feature_rows[KVS_ELF_FEATURE_COUNT] = {
#define FEROW_(id, fam, name, lost) {name, lost, KVS_ELF_FAMILY_##fam},
    KVS_ELF_FEATURES(FEROW_)
#undef FEROW_
};
static const char *const feature_state_names[] = {[KVS_ELF_FEATURE_ABSENT] = "absent",
                                                  [KVS_ELF_FEATURE_AVAILABLE] = "available",
                                                  [KVS_ELF_FEATURE_LOST] = "lost"};

const char *kvs_elf_feature_name(kvs_elf_feature_t f) {
  return (unsigned)f < KVS_ELF_FEATURE_COUNT ? feature_rows[f].name : "?";
}
const char *kvs_elf_feature_lost_text(kvs_elf_feature_t f) {
  return (unsigned)f < KVS_ELF_FEATURE_COUNT ? feature_rows[f].lost : "?";
}
kvs_elf_family_t kvs_elf_feature_family(kvs_elf_feature_t f) {
  return (unsigned)f < KVS_ELF_FEATURE_COUNT ? feature_rows[f].family : KVS_ELF_FAMILY_COUNT;
}
const char *kvs_elf_feature_state_name(kvs_elf_feature_state_t s) {
  return name_of(feature_state_names, NAMES_N(feature_state_names), (unsigned)s);
}

static bool reached(kvs_elf_verdict_t v) { return v == KVS_ELF_YES || v == KVS_ELF_PARTIAL; }

int kvs_elf_feature_check(const kvs_elf_report_t *r, kvs_elf_feature_t f,
                          kvs_elf_feature_status_t *out) {
  if (r == NULL || out == NULL || (unsigned)f >= KVS_ELF_FEATURE_COUNT) return -EINVAL;
  kvs_elf_feature_status_t st = {.state = KVS_ELF_FEATURE_ABSENT, .hook = KVS_ELF_HOOK_COUNT};
  bool present = false, lost = false, any_listed = false, any_ok = false;
  const kvs_elf_hook_t *all = feature_needs[f].all, *any = feature_needs[f].any;
  /* present: one of its "any" hooks is (the calls it serves), or without an "any" list one of
   * its "all" hooks */
  for (unsigned k = 0; k < FEATURE_NEEDS_MAX && any[k] != KVS_ELF_HOOK_COUNT; k++) {
    any_listed = true;
    present |= r->symbols[any[k]].verdict != KVS_ELF_ABSENT;
  }
  for (unsigned k = 0; k < 4 && all[k] != KVS_ELF_HOOK_COUNT && !any_listed; k++)
    present |= r->symbols[all[k]].verdict != KVS_ELF_ABSENT;
  if (present) {
    for (unsigned k = 0; k < 4 && all[k] != KVS_ELF_HOOK_COUNT && !lost; k++) {
      const kvs_elf_symbol_t *s = &r->symbols[all[k]];
      if (reached(s->verdict)) continue;
      lost = true;
      st.hook = all[k];
      st.verdict = s->verdict;
      st.reason = s->verdict == KVS_ELF_ABSENT ? KVS_ELF_REASON_NONE : s->reason;
    }
    kvs_elf_hook_t first_any = KVS_ELF_HOOK_COUNT;
    for (unsigned k = 0; k < FEATURE_NEEDS_MAX && any[k] != KVS_ELF_HOOK_COUNT; k++) {
      const kvs_elf_symbol_t *s = &r->symbols[any[k]];
      any_ok |= reached(s->verdict);
      if (first_any == KVS_ELF_HOOK_COUNT && s->verdict != KVS_ELF_ABSENT) first_any = any[k];
    }
    if (!lost && any_listed && !any_ok) {
      lost = true;
      st.hook = first_any != KVS_ELF_HOOK_COUNT ? first_any : any[0];
      st.verdict = r->symbols[st.hook].verdict;
      st.reason = st.verdict == KVS_ELF_ABSENT ? KVS_ELF_REASON_NONE : r->symbols[st.hook].reason;
    }
    st.state = lost ? KVS_ELF_FEATURE_LOST : KVS_ELF_FEATURE_AVAILABLE;
  }
  *out = st;
  return 0;
}

const char *kvs_elf_object_basename(const kvs_elf_object_t *o) {
  if (o == NULL) return "?";
  return base_name(o->path ? o->path : o->name ? o->name : "?");
}
