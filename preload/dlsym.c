/* preload: the dlsym hook (design §9.1 route 2).
 *
 * The CUDA runtime (static and shared) dlopen()s libcuda.so.1 and fetches entry points with
 * dlsym, so kvshim must see those lookups. Exporting dlsym has a catch: glibc's dlsym works
 * relative to its caller (it takes its own return address and finds the object that called):
 * dlsym(RTLD_NEXT, x) means "the next definition after the calling object", and
 * dlsym(RTLD_DEFAULT, x) searches the calling object's scope (which for a plugin opened
 * RTLD_LOCAL includes its own dependencies). A C wrapper calling the real dlsym would make
 * libkvshim the caller and change both answers.
 *
 * So the exported dlsym is a small assembly trampoline that keeps the caller's return address
 * intact:
 *   1. it asks kvs__dlsym_route(handle, name) where to go, preserving the arguments;
 *   2. it JUMPS there (a tail call: no frame of ours remains, the return address on the stack
 *      - x86-64 - or in the link register - AArch64 - is the original caller's), passing the
 *      caller's return address as a third argument.
 * The route is the real dlsym for every name no hook family hooks, for RTLD_DEFAULT, for
 * lookups made while kvshim itself is running, and for everything when the family is disabled
 * (KVSHIM_ENABLE=0 / KVSHIM_HOOKS): glibc then sees exactly the caller it would have seen
 * without kvshim, so RTLD_NEXT, RTLD_DEFAULT, handles and dlerror() behave exactly as without
 * the preload. (RTLD_DEFAULT needs no substitution: libkvshim is early in the global scope, so
 * a hooked name found that way already is the wrapper.)
 *
 * Hooked names with a handle or RTLD_NEXT go to kvs__dlsym_hooked, which looks the name up
 * itself and lets the family substitute its wrapper when the answer is the real function in
 * libcuda. A handle lookup does not depend on the caller, so the real dlsym gives the same
 * answer from here. RTLD_NEXT for a hooked name is emulated (kvs__next_symbol: the first object
 * after the caller's in load order defining the name); it differs from glibc only for objects
 * opened RTLD_LOCAL after the caller's object (searched here, skipped by glibc), and a miss
 * leaves dlerror() unset.
 *
 * The library itself never calls the public dlsym (it would land here); see runtime/resolve.c. */
#include <dlfcn.h>
#include <stddef.h>

#include "hooks.h"
#include "internal.h"
#include "resolve.h"
#include "runtime.h"

void *kvs__dlsym_hooked(void *handle, const char *name, void *caller)
    __attribute__((visibility("hidden"), used));
kvs__code_t kvs__dlsym_route(void *handle, const char *name)
    __attribute__((visibility("hidden"), used));

/* Stands in for the real dlsym if the C library has none (never on glibc). */
static void *dlsym_missing(void *handle, const char *name) {
  (void)handle;
  (void)name;
  return NULL;
}

/* Runs on every dlsym of the process: no allocation, no locking on the common path (a
 * hooked name may read the configuration once). Not instrumented: ASan's runtime calls dlsym
 * while it initialises. */
KVS__DLSYM_PATH kvs__code_t kvs__dlsym_route(void *handle, const char *name) {
  kvs__dlsym_fn real = kvs__real_dlsym_fn();
  if (kvs__unlikely(!real)) return (kvs__code_t)dlsym_missing;
  if (handle == RTLD_DEFAULT || !name || kvs__hook_depth != 0) return (kvs__code_t)real;
  size_t row;
  const kvs__family_t *f = kvs__family_for_name(name, &row);
  if (kvs__likely(!f) || !kvs__family_enabled(f)) return (kvs__code_t)real;
  return (kvs__code_t)kvs__dlsym_hooked;
}

void *kvs__dlsym_hooked(void *handle, const char *name, void *caller) {
  size_t row = 0;
  const kvs__family_t *f = kvs__family_for_name(name, &row);
  void *found = handle == RTLD_NEXT ? kvs__next_symbol(caller, name)
                                    : kvs__real_dlsym(handle, name);
  if (!found || !f) return found;
  return f->dlsym_substitute ? f->dlsym_substitute(f, row, found)
                             : kvs__family_substitute(f, row, found);
}

#if defined(__x86_64__)
#if defined(__CET__)
#define KVS__ENDBR "endbr64\n"
#else
#define KVS__ENDBR ""
#endif
/* At entry: rdi = handle, rsi = name, (%rsp) = caller's return address, rsp = 8 mod 16. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        ".p2align 4\n"
        "dlsym:\n"
        ".cfi_startproc\n" KVS__ENDBR
        "  pushq %rdi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  call kvs__dlsym_route\n"
        "  addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  movq (%rsp), %rdx\n" /* the caller's return address: third argument */
        "  jmp *%rax\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_BTI_DEFAULT)
#define KVS__BTI "bti c\n"
#else
#define KVS__BTI ""
#endif
/* At entry: x0 = handle, x1 = name, x30 = caller's return address. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        ".p2align 4\n"
        "dlsym:\n"
        ".cfi_startproc\n" KVS__BTI
        "  stp x29, x30, [sp, #-32]!\n"
        ".cfi_def_cfa_offset 32\n"
        ".cfi_offset 29, -32\n"
        ".cfi_offset 30, -24\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl kvs__dlsym_route\n"
        "  mov x16, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        ".cfi_restore 29\n"
        ".cfi_restore 30\n"
        ".cfi_def_cfa_offset 0\n"
        "  mov x2, x30\n"
        "  br x16\n"
        ".cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
#error "kvshim preload: the dlsym trampoline exists for x86-64 and AArch64 only"
#endif
