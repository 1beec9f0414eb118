# tests/disk/disk.cmake: the disk tier of `kvshim serve` (core/tiers/disk.c, design §18).
# disk_test.py runs one case per test, each with its own run directory and disk directory:
# restart survival (blobs, refengine's kvo chunks), a torn write, flipped bytes, ENOSPC (a 4 MiB
# tmpfs) and a read-only DIR (both in a private mount namespace, skipped without one), a DIR
# that cannot be made, --disk-size, two serves on one DIR, a pool smaller than a disk object;
# disk_llama.py: node-llama-cpp restores a prefix from disk after serve was SIGKILLed;
# test_disk_io.c: record versions in process (v2 block-aligned payloads written and read back,
# v1 segments still served, a version never misread).
# Included from tests/CMakeLists.txt.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_executable(test_disk_io ${CMAKE_CURRENT_SOURCE_DIR}/disk/test_disk_io.c)
target_link_libraries(test_disk_io PRIVATE kvshim_core kvshim_flags PkgConfig::CRITERION
  PkgConfig::XXHASH Threads::Threads)
add_test(NAME test_disk_io COMMAND test_disk_io --jobs 1)
set_tests_properties(test_disk_io PROPERTIES TIMEOUT 300 LABELS "unit"
  ENVIRONMENT "${KVSHIM_TEST_LSAN}")
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

# The node-llama-cpp CLI across a crash of serve (tests/engines/llama's engine; exit 77 =
# skipped when Node.js or its node_modules cannot be prepared).
if(TARGET kvshim_preload)
  set(disk_llama_asan "")
  if(KVSHIM_SANITIZE MATCHES "address")
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
      OUTPUT_VARIABLE disk_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(IS_ABSOLUTE "${disk_asan}" AND EXISTS "${disk_asan}")
      set(disk_llama_asan --asan-runtime ${disk_asan})
    endif()
  endif()
  add_test(NAME disk_node_restart
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/disk/disk_llama.py
            --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
            ${disk_llama_asan})
  # An engine test: it has the machine to itself under scripts/test's ctest -j (RUN_SERIAL).
  set_tests_properties(disk_node_restart PROPERTIES TIMEOUT 600 LABELS "e2e" SKIP_RETURN_CODE 77
    RUN_SERIAL ON)
endif()
