/* Fixture library without RPATH/RUNPATH that needs libfx_kvo.so: whether the loader finds
 * it depends on the executable's DT_RPATH (inherited) vs DT_RUNPATH (not inherited). */
#include <kvshim/kvo.h>

#include "fx.h"

FX_EXPORT int fx_mid_run(int n) { return kvo_lookup(NULL, NULL, (size_t)n); }
