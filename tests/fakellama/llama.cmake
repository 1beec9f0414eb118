# tests/fakellama/llama.cmake: the llama shim on the fake engine, LD_PRELOAD=libkvshim.so set
# only in the environment of the engine processes the drivers start, each case in its own
# temporary KVSHIM_RUN_DIR and group. Included from tests/fakellama/CMakeLists.txt.
#   llama_fake_<case>        the state API adapter (design §10.2): llama_shim.py runs fakehost,
#                            which opens libfakeplugin.so RTLD_LOCAL as Node opens an addon
#   llamaprefix_fake_<case>  the transparent prefix cache (design §10.3): llama_prefix.py runs
#                            each prefixhost script with and without kvshim, identical outputs
# The cases: `llama_shim.py --list`, `llama_prefix.py --list`.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim_llama OR NOT TARGET kvshim)
  message(STATUS "kvshim: llama shim tests skipped: libkvshim.so or the kvshim CLI not built")
  return()
endif()
kvshim_add_py_cases(llama fake ${CMAKE_CURRENT_LIST_DIR}/llama_shim.py
  LABELS integration TIMEOUT 180 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --host $<TARGET_FILE:fakellama_host> --plugin $<TARGET_FILE:fakeplugin>
       --preload $<TARGET_FILE:kvshim_preload> --cli $<TARGET_FILE:kvshim>)
kvshim_add_py_cases(llamaprefix fake ${CMAKE_CURRENT_LIST_DIR}/llama_prefix.py
  LABELS integration TIMEOUT 300 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --host $<TARGET_FILE:fakellama_prefixhost> --preload $<TARGET_FILE:kvshim_preload>
       --cli $<TARGET_FILE:kvshim>)
