/* kvshim: the public header of libkvshim.so (design §2).
 *
 * kvshim is injected, not linked: an operator starts an unmodified engine with
 *
 *     LD_PRELOAD=/usr/lib/libkvshim.so KVSHIM_POOL_SIZE=4G engine ...
 *
 * and configures it with KVSHIM_* environment variables (`kvshim --help` lists every one). An
 * engine never needs this header to be cached. It is for code that wants to know which kvshim
 * it is built beside (the version below), and it stands next to the one C ABI an engine may
 * implement on purpose: kvshim/kvo.h, the KV-offload hooks (design §10.1).
 *
 * Only kvshim/kvshim.h and kvshim/kvo.h are installed; every other header of the source tree is
 * internal and may change between any two commits. This header includes nothing and declares
 * no function: libkvshim.so exports only the engine functions it interposes. */
#ifndef KVSHIM_KVSHIM_H
#define KVSHIM_KVSHIM_H

/* The release. CMake reads these three lines for project(VERSION) (the top CMakeLists.txt), so
 * the version is written here once. */
#define KVSHIM_VERSION_MAJOR 0
#define KVSHIM_VERSION_MINOR 1
#define KVSHIM_VERSION_PATCH 0

#define KVSHIM__STR(x) #x
#define KVSHIM__XSTR(x) KVSHIM__STR(x)
/* "0.1.0" */
#define KVSHIM_VERSION_STRING                                                                    \
  KVSHIM__XSTR(KVSHIM_VERSION_MAJOR) "." KVSHIM__XSTR(KVSHIM_VERSION_MINOR) "." KVSHIM__XSTR(     \
      KVSHIM_VERSION_PATCH)
/* One number that grows with every release: 100 * (100 * major + minor) + patch. */
#define KVSHIM_VERSION_NUMBER                                                                    \
  (KVSHIM_VERSION_MAJOR * 10000 + KVSHIM_VERSION_MINOR * 100 + KVSHIM_VERSION_PATCH)

#endif
