# xxHash compiled in: every user of PkgConfig::XXHASH gets the header-only build
# (XXH_INLINE_ALL: the functions are static inline in each file that includes xxhash.h), and
# nothing links libxxhash.so. libkvshim.so and the test programs then need only libc (and the
# driver) at run time, so a build carried to a machine without this project's packages runs
# there (scripts/gpu-check checks it with ldd). Only xxhash.h is needed at build time.
if(TARGET PkgConfig::XXHASH)
  set_target_properties(PkgConfig::XXHASH PROPERTIES
    INTERFACE_LINK_LIBRARIES ""
    INTERFACE_LINK_OPTIONS ""
    INTERFACE_LINK_DIRECTORIES "")
  set_property(TARGET PkgConfig::XXHASH APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS XXH_INLINE_ALL)
endif()
