# tests/fakellama/prefix.cmake: the transparent llama.cpp prefix cache (shims/llama/prefix.c,
# design §10.3) on the fake engine's prefixhost. llama_prefix.py runs each script with and
# without LD_PRELOAD=libkvshim.so (set only in the engine processes' environment, each case in
# its own KVSHIM_RUN_DIR) and requires identical outputs. Tests llamaprefix_fake_<case> (the
# cases: `llama_prefix.py --list`). Included from tests/fakellama/CMakeLists.txt.
if(NOT TARGET kvshim_preload OR NOT TARGET fakellama_prefixhost OR NOT TARGET kvshim)
  message(STATUS "kvshim: llama prefix tests skipped: libkvshim.so or prefixhost not built")
  return()
endif()
kvshim_add_py_cases(llamaprefix fake ${CMAKE_CURRENT_LIST_DIR}/llama_prefix.py
  LABELS integration TIMEOUT 300 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --host $<TARGET_FILE:fakellama_prefixhost> --preload $<TARGET_FILE:kvshim_preload>
       --cli $<TARGET_FILE:kvshim>)
