/* kvshim elfscan: which hook families a binary or a running process contains, where each hook
 * symbol is defined, who calls it, and whether LD_PRELOAD can interpose those calls
 * (design §11).
 *
 * One entry point, offline, for `kvshim inspect`: kvs_elf_inspect() opens a binary with libelf,
 * resolves its DT_NEEDED closure as the dynamic loader would and reads every object's symbols,
 * dynamic relocations and code. At run time the library answers KVSHIM_HOOKS=auto with its own
 * scan of the loaded objects (runtime/hooks.c), which needs no libelf.
 *
 * Interposition rules the verdicts encode (glibc's loader; code is decoded on x86 and aarch64):
 *   - a call from object A to a symbol A does not define goes through a dynamic relocation
 *     (JUMP_SLOT for the PLT, GLOB_DAT for the GOT, or a data word) that the loader binds to
 *     the first definition in the global lookup order: executable, LD_PRELOAD libraries, then
 *     the DT_NEEDED closure breadth first. So it is interposable, unless the definition is in
 *     the executable itself (the executable precedes LD_PRELOAD in that order), or the
 *     process is statically linked (no loader: LD_PRELOAD is ignored).
 *   - a call inside the defining object is interposable only when it also goes through a
 *     dynamic relocation against the symbol and the object is not DF_SYMBOLIC. A call the
 *     static linker bound (hidden or protected visibility, -Bsymbolic, -Bsymbolic-functions,
 *     -fno-semantic-interposition, any call inside an executable) cannot be interposed.
 *     inspect finds those by decoding direct call/jump instructions whose target is the
 *     definition (x86-64 call/jmp rel32, aarch64 bl/b).
 *   - a definition that no object reaches through a dynamic relocation (no import names it,
 *     its definer calls it directly or not at all: a library linked into the engine and called
 *     through its internals) is not interposable (reason "unreached"): LD_PRELOAD would see
 *     no call. Inspecting a library alone therefore reports what the library itself reaches;
 *     inspect the program or plugin that calls it.
 *   - objects opened with dlopen (plugins, RTLD_LOCAL or not) are not in anyone's DT_NEEDED:
 *     static analysis of the executable cannot see them; inspect the plugin itself. Their
 *     imports are still interposable: the global scope (which holds LD_PRELOAD) is searched
 *     before a local one.
 *
 * Ownership: a report is owned by the caller of kvs_elf_inspect() and freed with
 * kvs_elf_report_destroy(); every pointer inside it lives as long as the report. Hook and
 * family names are static strings. Thread safety: the functions share no state. */
#ifndef KVSHIM_INSPECT_ELFSCAN_H
#define KVSHIM_INSPECT_ELFSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- hook tables: generated from the families' rows (shims/<family>/<family>_hooks.h, the
 * lists libkvshim.so's exports are generated from), never retyped ------------------------- */

#include "families.h"

/* inspect's families are the engine families of shims/families.h (KVS_HOOK_FAMILIES):
 * X(ID, name, title, rows). */
typedef enum kvs_elf_family {
#define KVS__ELF_FAM_ENUM(id, name, title, rows) KVS_ELF_FAMILY_##id,
  KVS_HOOK_FAMILIES(KVS__ELF_FAM_ENUM)
#undef KVS__ELF_FAM_ENUM
  KVS_ELF_FAMILY_COUNT
} kvs_elf_family_t;

/* Every hook, families in KVS_HOOK_FAMILIES order, so a family's hooks are contiguous. */
typedef enum kvs_elf_hook {
#define KVS__ELF_HOOK_ENUM(ret, name, params, args) KVS_ELF_HOOK_##name,
#define KVS__ELF_FAM_HOOKS(id, name, title, rows) rows(KVS__ELF_HOOK_ENUM)
  KVS_HOOK_FAMILIES(KVS__ELF_FAM_HOOKS)
#undef KVS__ELF_FAM_HOOKS
#undef KVS__ELF_HOOK_ENUM
  KVS_ELF_HOOK_COUNT
} kvs_elf_hook_t;

/* Per-family bit masks (bit i = hook first + i) need every family to fit 64 hooks. */
#define KVS_ELF_FAMILY_MAX_HOOKS 64

const char *kvs_elf_family_name(kvs_elf_family_t f);  /* "cuda"; "?" when out of range */
const char *kvs_elf_family_title(kvs_elf_family_t f); /* "CUDA driver"; "?" when out of range */
/* The family's hooks are [*first, *first + *count). Returns 0 or -EINVAL. */
int kvs_elf_family_hooks(kvs_elf_family_t f, kvs_elf_hook_t *first, unsigned *count);
const char *kvs_elf_hook_name(kvs_elf_hook_t h);      /* "cuMemAlloc_v2"; "?" when out of range */
kvs_elf_family_t kvs_elf_hook_family(kvs_elf_hook_t h); /* KVS_ELF_FAMILY_COUNT when out of range */
/* The hook named name, or -ENOENT. */
int kvs_elf_hook_find(const char *name, kvs_elf_hook_t *out);

/* ---- verdicts ------------------------------------------------------------------------------ */

/* Why a call cannot be interposed: X(ID, name, explanation). Values are reported in JSON by
 * name only. */
#define KVS_ELF_REASONS(X)                                                                    \
  X(NONE, "none", "")                                                                         \
  X(STATIC, "static", "statically linked: there is no dynamic loader, LD_PRELOAD is ignored")  \
  X(EXECUTABLE, "executable",                                                                 \
    "defined in the executable, which precedes LD_PRELOAD in the lookup order; its own calls " \
    "are bound at link time")                                                                 \
  X(SYMBOLIC, "symbolic",                                                                     \
    "the defining object is linked -Bsymbolic (DF_SYMBOLIC): its references bind to itself")  \
  X(SYMBOLIC_FUNCTIONS, "symbolic-functions",                                                 \
    "calls inside the defining object are bound at link time (-Bsymbolic-functions or "       \
    "-fno-semantic-interposition)")                                                           \
  X(PROTECTED, "protected",                                                                   \
    "protected visibility (STV_PROTECTED): references inside the defining object bind to it")  \
  X(HIDDEN, "hidden", "hidden visibility or not exported (not in .dynsym): only its own "      \
    "object can call it, bound at link time")                                                 \
  X(UNREACHED, "unreached",                                                                   \
    "exported, but no object inspected reaches it through a dynamic relocation (PLT/GOT) that " \
    "LD_PRELOAD can redirect: the code that uses it calls the implementation directly (e.g. "   \
    "llama.cpp linked in statically and called through its C++ internals), or its callers "     \
    "are outside what was inspected (inspect the program or plugin that calls it)")

typedef enum kvs_elf_reason {
#define KVS__ELF_REASON_ENUM(id, name, text) KVS_ELF_REASON_##id,
  KVS_ELF_REASONS(KVS__ELF_REASON_ENUM)
#undef KVS__ELF_REASON_ENUM
  KVS_ELF_REASON_COUNT
} kvs_elf_reason_t;

const char *kvs_elf_reason_name(kvs_elf_reason_t r); /* "symbolic"; "?" when out of range */
const char *kvs_elf_reason_text(kvs_elf_reason_t r); /* one sentence; "" for NONE */

/* A symbol's verdict over every call route inspect found to it. */
typedef enum kvs_elf_verdict {
  KVS_ELF_ABSENT = 0,  /* no object of the closure defines or references it */
  KVS_ELF_YES = 1,     /* some object reaches it through a dynamic relocation LD_PRELOAD can
                          redirect (an import, or the definer's own PLT/GOT call), and every
                          route found is interposable. A definition no route reaches is NO
                          (UNREACHED): nothing promises that LD_PRELOAD will see a call */
  KVS_ELF_PARTIAL = 2, /* imports are interposable, some calls inside the definer are not */
  KVS_ELF_NO = 3       /* no route found is interposable */
} kvs_elf_verdict_t;

const char *kvs_elf_verdict_name(kvs_elf_verdict_t v); /* "absent", "yes", "partial", "no" */

/* ---- features: what a family's hooks serve, and what is lost when they cannot be
 * interposed. X(ID, family ID, name, what is lost). The hooks each feature needs are listed
 * once, in elfscan.c (feature_needs). */
#define KVS_ELF_FEATURES(X)                                                                   \
  X(LLAMA_STATE, LLAMA, "state adapter",                                                      \
    "sequence states are saved and loaded by llama.cpp alone, never through kvshim's cache")  \
  X(LLAMA_PREFIX, LLAMA, "prefix cache",                                                      \
    "no prompt prefix is restored from kvshim's cache: every token is computed")

typedef enum kvs_elf_feature {
#define KVS__ELF_FEATURE_ENUM(id, fam, name, lost) KVS_ELF_FEATURE_##id,
  KVS_ELF_FEATURES(KVS__ELF_FEATURE_ENUM)
#undef KVS__ELF_FEATURE_ENUM
  KVS_ELF_FEATURE_COUNT
} kvs_elf_feature_t;

typedef enum kvs_elf_feature_state {
  KVS_ELF_FEATURE_ABSENT = 0,    /* none of the calls it serves is present */
  KVS_ELF_FEATURE_AVAILABLE = 1, /* every hook it needs is interposable (yes or partial) */
  KVS_ELF_FEATURE_LOST = 2       /* a hook it needs is present but not interposable, or
                                    missing while others are present */
} kvs_elf_feature_state_t;

typedef struct kvs_elf_feature_status {
  kvs_elf_feature_state_t state;
  kvs_elf_hook_t hook;     /* LOST: the first hook it needs that fails it */
  kvs_elf_verdict_t verdict; /* LOST: that hook's verdict (ABSENT when it is missing) */
  kvs_elf_reason_t reason; /* LOST: that hook's reason (NONE when it is missing) */
} kvs_elf_feature_status_t;

const char *kvs_elf_feature_name(kvs_elf_feature_t f); /* "prefix cache"; "?" out of range */
const char *kvs_elf_feature_lost_text(kvs_elf_feature_t f); /* what is lost; "?" out of range */
kvs_elf_family_t kvs_elf_feature_family(kvs_elf_feature_t f);
const char *kvs_elf_feature_state_name(kvs_elf_feature_state_t s); /* "absent", "available",
                                                                       "lost" */

/* "<title>: <definer>, <yes>/<present> hooks interposable" into buf (always NUL-terminated
 * when n > 0; cut when too long). definer NULL or "" prints "no definition". The one format
 * of the per-family line, shared by inspect and the run-time scan.
 * Returns the length it wanted (as snprintf), or -EINVAL (buf NULL with n > 0). */
int kvs_elf_summary_line(char *buf, size_t n, const char *title, const char *definer,
                         unsigned yes, unsigned present);

/* ---- offline inspection (libelf) ----------------------------------------------------------- */

typedef enum kvs_elf_kind {
  KVS_ELF_KIND_EXEC = 0,       /* ET_EXEC with an interpreter */
  KVS_ELF_KIND_PIE = 1,        /* position-independent executable */
  KVS_ELF_KIND_SHARED = 2,     /* a shared library (e.g. a plugin) inspected on its own */
  KVS_ELF_KIND_STATIC = 3,     /* ET_EXEC without an interpreter */
  KVS_ELF_KIND_STATIC_PIE = 4  /* static-pie: ET_DYN, DF_1_PIE, no interpreter */
} kvs_elf_kind_t;

const char *kvs_elf_kind_name(kvs_elf_kind_t k); /* "executable", "pie", "shared", "static", ... */

/* How an object of the closure was found (the loader's search steps, in its order). */
typedef enum kvs_elf_via {
  KVS_ELF_VIA_ARGUMENT = 0, /* the inspected binary itself */
  KVS_ELF_VIA_PATH,         /* DT_NEEDED held a '/': opened as named */
  KVS_ELF_VIA_RPATH,        /* DT_RPATH of the requester or of one of its loaders */
  KVS_ELF_VIA_LD_LIBRARY_PATH,
  KVS_ELF_VIA_RUNPATH,      /* DT_RUNPATH of the requester */
  KVS_ELF_VIA_CACHE,        /* /etc/ld.so.cache (or `ldconfig -p` when it is unreadable) */
  KVS_ELF_VIA_DEFAULT,      /* a default directory */
  KVS_ELF_VIA_NOT_FOUND     /* path is NULL */
} kvs_elf_via_t;

const char *kvs_elf_via_name(kvs_elf_via_t v); /* "runpath", "ld.so.cache", "not found", ... */

#define KVS_ELF_OBJ_SYMBOLIC 0x1u /* DT_SYMBOLIC or DF_SYMBOLIC */
#define KVS_ELF_OBJ_NODEFLIB 0x2u /* DF_1_NODEFLIB: no cache, no default dirs for its needs */
#define KVS_ELF_OBJ_NO_CODE_SCAN 0x4u /* its machine is not decoded: direct calls unknown */

typedef struct kvs_elf_object {
  char *name;      /* as requested: the argument for the root, else the DT_NEEDED string */
  char *path;      /* the file found (NULL when not found); for the root, the argument */
  char *soname;    /* DT_SONAME or NULL */
  char *error;     /* NULL, or why the file found could not be read (then it adds nothing) */
  int needed_by;   /* index of the first object whose DT_NEEDED named it; -1 for the root */
  kvs_elf_via_t via;
  unsigned flags;  /* KVS_ELF_OBJ_* */
} kvs_elf_object_t;

/* What one object has to do with one hook. An object appears in a symbol's uses only when it
 * defines it or holds a dynamic reference (undefined .dynsym entry or relocation) to it. */
typedef enum kvs_elf_def {
  KVS_ELF_DEF_NONE = 0,     /* references it: an import */
  KVS_ELF_DEF_EXPORTED = 1, /* defined in .dynsym with default or protected visibility */
  KVS_ELF_DEF_INTERNAL = 2  /* defined only in .symtab (hidden, local, or an executable's
                               unexported global): invisible to the loader */
} kvs_elf_def_t;

/* A definition with local binding: what a hidden global becomes once linked (the linker
 * drops STV_HIDDEN), or a static function of the same name. */
#define KVS_ELF_VIS_LOCAL 4

typedef struct kvs_elf_use {
  uint32_t object;       /* index into report->objects */
  uint8_t def;           /* kvs_elf_def_t */
  uint8_t visibility;    /* STV_* of the definition, or KVS_ELF_VIS_LOCAL (0 for an import) */
  uint8_t interposable;  /* 1 when this object's calls reach an LD_PRELOAD definition */
  uint8_t reason;        /* kvs_elf_reason_t when !interposable and it has calls */
  uint32_t jump_slot;    /* dynamic relocations against the symbol, by kind: PLT, */
  uint32_t glob_dat;     /* GOT, */
  uint32_t other_relocs; /* anything else (data words) */
  int32_t direct_calls;  /* definers: call/jump instructions whose target is the definition,
                            bound at link time; -1 when the machine is not decoded; 0 for
                            imports */
  uint32_t pointers;     /* definers: RELATIVE relocations whose addend is the definition
                            (address tables such as a resolver's; not calls) */
} kvs_elf_use_t;

typedef struct kvs_elf_symbol {
  kvs_elf_hook_t hook;
  kvs_elf_verdict_t verdict;
  kvs_elf_reason_t reason;   /* the first route's reason when verdict is NO or PARTIAL */
  int definer;               /* object imports bind to: the first exported definition in load
                                order; -1 when none (hidden only, or its provider not found) */
  size_t n_uses;             /* uses[0..n_uses) in load order */
  kvs_elf_use_t *uses;
} kvs_elf_symbol_t;

typedef struct kvs_elf_report {
  kvs_elf_kind_t kind;
  char *interp;              /* PT_INTERP of the root, or NULL */
  unsigned machine;          /* e_machine of the root */
  size_t n_objects;          /* objects[0] is the root; then the closure in load order */
  kvs_elf_object_t *objects;
  kvs_elf_symbol_t symbols[KVS_ELF_HOOK_COUNT]; /* indexed by kvs_elf_hook_t */
} kvs_elf_report_t;

typedef struct kvs_elf_inspect_config {
  const char *ld_library_path; /* as in the environment ("a:b"), or NULL for none */
  const char *ld_cache;        /* NULL: /etc/ld.so.cache */
  bool no_ldconfig;            /* do not run `ldconfig -p` when the cache is unreadable */
} kvs_elf_inspect_config_t;

/* Inspects the binary at path (cfg NULL = defaults) into a new report (*out, owned by the
 * caller). Objects of the closure that are missing or unreadable are recorded in the report,
 * not errors. Returns 0, or a negative errno about the root: -ENOENT, -EACCES, -EISDIR...
 * (open/read), -ENOEXEC (not an ELF file, or not an executable or shared object),
 * -EPROTONOSUPPORT (an ELF file libelf cannot parse), -ENOMEM, -E2BIG (closure too large).
 * When err is not NULL, a one-line explanation is written there (err_len bytes, NUL-
 * terminated) on failure. *out is written only on success. */
int kvs_elf_inspect(const char *path, const kvs_elf_inspect_config_t *cfg,
                    kvs_elf_report_t **out, char *err, size_t err_len);
void kvs_elf_report_destroy(kvs_elf_report_t *r); /* accepts NULL */

typedef struct kvs_elf_family_summary {
  unsigned present;     /* hooks with verdict != ABSENT */
  unsigned yes;         /* ... YES */
  unsigned partial;     /* ... PARTIAL */
  unsigned no;          /* ... NO; present == yes + partial + no */
  int definer;          /* object defining most of the family's present hooks; -1 none */
  unsigned n_definers;  /* distinct objects defining at least one of them */
} kvs_elf_family_summary_t;

/* Returns 0 or -EINVAL (NULL report or out, bad family). */
int kvs_elf_family_summarize(const kvs_elf_report_t *r, kvs_elf_family_t f,
                             kvs_elf_family_summary_t *out);

/* Whether the report's hooks serve feature f: every hook of its "all" list must be
 * interposable (verdict YES or PARTIAL), and, when it has an "any" list, one hook of that list
 * present must be. Returns 0 or -EINVAL (NULL report or out, bad feature). */
int kvs_elf_feature_check(const kvs_elf_report_t *r, kvs_elf_feature_t f,
                          kvs_elf_feature_status_t *out);

/* Base name of an object (its path's, else its name's). Never NULL. */
const char *kvs_elf_object_basename(const kvs_elf_object_t *o);

#ifdef __cplusplus
}
#endif
#endif
