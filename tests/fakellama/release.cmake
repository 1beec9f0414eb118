# tests/fakellama/release.cmake: llamarelease_fake_<case> (integration), the table of llama.cpp
# releases kvshim knows (shims/llama/model.h): llama_release.py runs prefixhost with the pinned
# defaults (known) and with FAKELLAMA_DEFAULTS=unknown (one warning, every call passes through).
# Included from tests/fakellama/CMakeLists.txt after llama.cmake.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim_llama OR NOT TARGET kvshim)
  return()
endif()
kvshim_add_py_cases(llamarelease fake ${CMAKE_CURRENT_LIST_DIR}/llama_release.py
  LABELS integration TIMEOUT 180 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --host $<TARGET_FILE:fakellama_prefixhost> --preload $<TARGET_FILE:kvshim_preload>
       --cli $<TARGET_FILE:kvshim>)
