/* Fixture library defining llama_state_seq_save_file; linked by the plugin libfx_plugin.so. */
#include "fx.h"

FX_EXPORT int llama_state_seq_save_file(void *ctx, int n) { return ctx ? n : n + 1; }
