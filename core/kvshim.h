/* kvshim core: the umbrella header for tools and tests. */
#ifndef KVSHIM_KVSHIM_H
#define KVSHIM_KVSHIM_H
#include "keys.h"
#include "log.h"
#include "options.h"
#include "pool.h"
#include "stats.h"
#include "store.h"
#define KVSHIM_VERSION_STRING "0.1.0"
#endif
