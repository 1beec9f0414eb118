/* Fixture library that imports kvo_lookup and finds it in the executable (fx_cb_main). */
#include <kvshim/kvo.h>

#include "fx.h"

FX_EXPORT int fx_cb_run(int n) { return kvo_lookup(NULL, NULL, (size_t)n); }
