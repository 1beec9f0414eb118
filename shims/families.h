/* shims/families.h: every hook family kvshim has, written once (style rule 14). No includes
 * of its own beyond the families' row headers (by their paths from here, so any target finds
 * them), so the C preprocessor alone can read it (the export map is made with cc -E) and CMake
 * reads its rows as text (cmake/families.cmake). runtime/rows.h reads it too: the one header of
 * shims/ the runtime includes, with the *_rows.h it includes (design §2).
 *
 * KVS_HOOK_FAMILIES(X): X(ID, name, title, rows), one row per engine family:
 *   ID     KVS_HOOK_<ID>: its KVSHIM_HOOKS bit (runtime/rows.h makes it from the row's
 *          position), KVS_ELF_FAMILY_<ID> in `kvshim inspect`, and KVS_<ID>_OPTIONS and
 *          KVS_<ID>_STATS: the family's option and stat rows, in shims/<name>/<name>_rows.h
 *          (empty when it has none), which runtime/rows.h composes after core's and the
 *          runtime's
 *   name   its KVSHIM_HOOKS choice (runtime/rows.h) and inspect's JSON name; also its
 *          folder shims/<name> and its CMake target kvshim_<name>
 *   title  its name in inspect's lines ("llama.cpp: libllama.so, 29/37 hooks interposable")
 *   rows   every hook it interposes, X(ret, name, params, args) rows of its *_hooks.h: the
 *          export map (preload/exports.map.c) and inspect's tables are made from them
 * A row's position is its bit: KVS_HOOK_<ID> == 1u << position, the order of KVSHIM_HOOKS's
 * choices.
 *
 * KVS_HOOK_FAMILY_OBJECTS(X): X(ID, object): the run-time family objects kvs__family_<object>
 * (runtime/hooks.h) that preload/ assembles into libkvshim.so, in init and dlsym-match order,
 * each under its engine family. llama.cpp has two: the state API adapter (llama) and the
 * transparent prefix cache (llama_prefix), which KVSHIM_LLAMA_PREFIX turns off on its own.
 *
 * A new family: its shims/<name>/ folder with <name>_hooks.h, <name>_rows.h and a
 * kvs__family_<name> object, its two headers included here, one row in each list here. */
#ifndef KVSHIM_SHIMS_FAMILIES_H
#define KVSHIM_SHIMS_FAMILIES_H

#include "cuda/cuda_hooks.h"
#include "cuda/cuda_rows.h"
#include "kvo/kvo_hooks.h"
#include "kvo/kvo_rows.h"
#include "llama/llama_hooks.h"
#include "llama/llama_rows.h"

/* The llama.cpp family's rows: the state API adapter's, then the prefix cache's. */
#define KVS__LLAMA_FAMILY_ROWS(X) KVS_LLAMA_HOOKS(X) KVS_LLAMA_PREFIX_HOOKS(X)

#define KVS_HOOK_FAMILIES(X)                                                                  \
  X(CUDA, cuda, "CUDA driver", KVS_CUDA_HOOKS)                                                \
  X(LLAMA, llama, "llama.cpp", KVS__LLAMA_FAMILY_ROWS)                                        \
  X(KVO, kvo, "kvo", KVS_KVO_HOOKS)

#define KVS_HOOK_FAMILY_OBJECTS(X) X(CUDA, cuda) X(LLAMA, llama) X(LLAMA, llama_prefix) X(KVO, kvo)

#endif
