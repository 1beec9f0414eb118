/* Fixture plugin: dlopen'd RTLD_LOCAL by fx_host; calls llama_state_seq_save_file of the
 * library it links (libfx_state.so) through its PLT. */
#include "fx.h"

FX_EXPORT int fx_plugin_run(int n) { return llama_state_seq_save_file((void *)0, n) * 2; }
