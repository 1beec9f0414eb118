# tests/disk/disk.cmake: the disk tier of `kvshim serve` (core/disk.c, design §18).
# disk_test.py runs one case per test, each with its own run directory and disk directory:
# restart survival (blobs, refengine's kvo chunks), a torn write, flipped bytes, ENOSPC (a 4 MiB
# tmpfs) and a read-only DIR (both in a private mount namespace, skipped without one), a DIR
# that cannot be made, --disk-size, two serves on one DIR, a pool smaller than a disk object.
# Included from tests/CMakeLists.txt.
if(NOT TARGET kvshim)
  return()
endif()
set(disk_args --cli $<TARGET_FILE:kvshim>)
set(disk_exclude "")
if(TARGET refengine AND TARGET kvshim_preload)
  list(APPEND disk_args --engine $<TARGET_FILE:refengine> --preload $<TARGET_FILE:kvshim_preload>)
else()
  set(disk_exclude EXCLUDE refengine)
endif()
kvshim_add_py_cases(disk fake ${CMAKE_CURRENT_SOURCE_DIR}/disk/disk_test.py
  LABELS integration TIMEOUT 180 ASAN_RUNTIME FAKECUDA SKIP_RETURN_CODE 77 ${disk_exclude}
  ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS ${disk_args})
