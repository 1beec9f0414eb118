# tests/fakellama/llama.cmake: the llama.cpp state API adapter (shims/llama, design §10.2) on
# the fake engine. llama_shim.py runs fakehost (which opens libfakeplugin.so RTLD_LOCAL, as
# Node opens an addon) with and without LD_PRELOAD=libkvshim.so, set only in the environment of
# the processes it starts; each case has its own temporary KVSHIM_RUN_DIR. Tests llama_fake_<case>
# (the cases: `llama_shim.py --list`). Included from tests/fakellama/CMakeLists.txt.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim_llama OR NOT TARGET fakellama_host)
  message(STATUS "kvshim: llama integration tests skipped: libkvshim.so or fakellama not built")
  return()
endif()
kvshim_add_py_cases(llama fake ${CMAKE_CURRENT_LIST_DIR}/llama_shim.py
  LABELS integration TIMEOUT 180 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --host $<TARGET_FILE:fakellama_host> --plugin $<TARGET_FILE:fakeplugin>
       --preload $<TARGET_FILE:kvshim_preload> --cli $<TARGET_FILE:kvshim>)
