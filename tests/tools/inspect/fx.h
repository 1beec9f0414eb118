/* inspect test fixtures: shared declarations. The llama_* names here are stand-ins with
 * simple signatures (the fixtures only need the names); kvo_* use the real ABI header. */
#ifndef KVSHIM_TESTS_INSPECT_FX_H
#define KVSHIM_TESTS_INSPECT_FX_H

#define FX_EXPORT __attribute__((visibility("default")))
/* Keep a call a call: no inlining, and (gcc) no clones whose address differs from the symbol. */
#if defined(__clang__)
#define FX_KEEP __attribute__((noinline))
#else
#define FX_KEEP __attribute__((noinline, noclone))
#endif

int llama_decode(void *ctx, int n);
int llama_state_seq_save_file(void *ctx, int n);
int fx_run(int n);
int fx_cb_run(int n);
int fx_mid_run(int n);
int fx_plugin_run(int n);

#endif
