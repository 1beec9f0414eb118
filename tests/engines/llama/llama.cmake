# tests/engines/llama: the node-llama-cpp test engine (app.mjs) and the tiny-gguf model generator.
# Included from tests/engines/CMakeLists.txt. Nothing here is built; the tests run Python 3.
#
# llama_py_tiny_gguf (unit): scripts/tiny-gguf's output read back by an independent GGUF reader.
# llama_node_baseline (e2e): app.mjs with node-llama-cpp 3.21.1, no kvshim: loaded prefix states
#   reproduce the reference tokens exactly, and another prefix's state changes them. It runs
#   scripts/llama-setup first (npm ci when node_modules is not current), so it may need the npm
#   registry once; without Node.js >= 20 or the registry it exits 77 and ctest reports it skipped.
set(kvshim_llama_dir ${CMAKE_CURRENT_LIST_DIR})

kvshim_add_py_cases(llama py ${kvshim_llama_dir}/check_tiny_gguf.py LABELS unit TIMEOUT 120
  ARGS --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-tiny-gguf)
kvshim_add_py_cases(llama node ${kvshim_llama_dir}/check_baseline.py LABELS e2e TIMEOUT 1200
  SKIP_RETURN_CODE 77 RUN_SERIAL ARGS --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-baseline)

# llama_node_<case> (e2e): app.mjs under LD_PRELOAD=libkvshim.so (set only in the engines'
# environment, a temporary KVSHIM_RUN_DIR per test), one case per test (check_kvshim.py's header):
#   peer       B restores A's saved prefix through the peer protocol while A is alive
#   serve      A pushes to `kvshim serve` and exits; B restores from the serve peer
#   negative   another prefix's state under B's expected name changes B's tokens (it is used)
#   isolation  a second model of the same shape never gets the first model's state
#   fault      A stopped, then killed while B waits for it: B falls back with the right tokens
#   inspect    `kvshim inspect --json` on node-llama-cpp's addon: llama hooks interposable
# Same skip rule as llama_node_baseline (exit 77 without Node.js >= 20 or the npm registry).
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  message(STATUS "kvshim: llama e2e tests with kvshim skipped: libkvshim.so or the CLI not built")
  return()
endif()
kvshim_add_py_cases(llama node ${kvshim_llama_dir}/check_kvshim.py
  LABELS e2e TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL ASAN_RUNTIME
  ARGS --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
       --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-kvshim-{case})
include(${CMAKE_CURRENT_LIST_DIR}/prefix.cmake)
