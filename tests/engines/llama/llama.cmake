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
