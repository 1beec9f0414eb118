# tests/engines/llama: the node-llama-cpp test engine (app.mjs) and the tiny-gguf model generator.
# Included from tests/engines/CMakeLists.txt. Nothing here is built; the tests run Python 3.
#
# llama_tiny_gguf (unit): scripts/tiny-gguf's output read back by an independent GGUF reader.
# llama_baseline (e2e): app.mjs with node-llama-cpp 3.21.1, no kvshim: loaded prefix states
#   reproduce the reference tokens exactly, and another prefix's state changes them. It runs
#   scripts/llama-setup first (npm ci when node_modules is not current), so it may need the npm
#   registry once; without Node.js >= 20 or the registry it exits 77 and ctest reports it skipped.

find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(kvshim_llama_dir ${CMAKE_CURRENT_LIST_DIR})

add_test(NAME llama_tiny_gguf
  COMMAND ${Python3_EXECUTABLE} ${kvshim_llama_dir}/check_tiny_gguf.py
          --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-tiny-gguf)
set_tests_properties(llama_tiny_gguf PROPERTIES TIMEOUT 120 LABELS "unit")

add_test(NAME llama_baseline
  COMMAND ${Python3_EXECUTABLE} ${kvshim_llama_dir}/check_baseline.py
          --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-baseline)
set_tests_properties(llama_baseline PROPERTIES TIMEOUT 1200 LABELS "e2e" SKIP_RETURN_CODE 77
  RUN_SERIAL ON)

# llama_kvshim_<case> (e2e): app.mjs under LD_PRELOAD=libkvshim.so (set only in the engines'
# environment, a temporary KVSHIM_RUN_DIR per test), one case per test (check_kvshim.py's header):
#   peer       B restores A's saved prefix through the peer protocol while A is alive
#   serve      A pushes to `kvshim serve` and exits; B restores from the serve peer
#   negative   another prefix's state under B's expected name changes B's tokens (it is used)
#   isolation  a second model of the same shape never gets the first model's state
#   fault      A stopped, then killed while B waits for it: B falls back with the right tokens
#   inspect    `kvshim inspect --json` on node-llama-cpp's addon: llama hooks interposable
# Same skip rule as llama_baseline (exit 77 without Node.js >= 20 or the npm registry).
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  message(STATUS "kvshim: llama e2e tests with kvshim skipped: libkvshim.so or the CLI not built")
  return()
endif()
set(llama_e2e_extra "")
if(KVSHIM_SANITIZE MATCHES "address")
  # The sanitizer runtime must come first in LD_PRELOAD (node is not instrumented).
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE llama_e2e_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${llama_e2e_asan}" AND EXISTS "${llama_e2e_asan}")
    set(llama_e2e_extra --asan-runtime ${llama_e2e_asan})
  endif()
endif()
foreach(case IN ITEMS peer serve negative isolation fault inspect)
  add_test(NAME llama_kvshim_${case}
    COMMAND ${Python3_EXECUTABLE} ${kvshim_llama_dir}/check_kvshim.py --case ${case}
            --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
            --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-kvshim-${case} ${llama_e2e_extra})
  set_tests_properties(llama_kvshim_${case} PROPERTIES TIMEOUT 600 LABELS "e2e"
    SKIP_RETURN_CODE 77 RUN_SERIAL ON)
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/prefix.cmake)
