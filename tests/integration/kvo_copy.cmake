# One copy per node (issue 13, design §3.5): refengine processes and `kvshim serve` in one group
# (kvo_copy_test.py). Tests kvocopy_fake_<case> (the cases: `kvo_copy_test.py --list`). Included
# from tests/integration/CMakeLists.txt.
if(NOT TARGET refengine OR NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  message(STATUS "kvshim: kvo one-copy tests skipped: refengine, libkvshim.so or kvshim not built")
  return()
endif()
kvshim_add_py_cases(kvocopy fake ${CMAKE_CURRENT_SOURCE_DIR}/kvo_copy_test.py
  LABELS integration TIMEOUT 300 ASAN_RUNTIME FAKECUDA ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --engine $<TARGET_FILE:refengine> --preload $<TARGET_FILE:kvshim_preload>
       --cli $<TARGET_FILE:kvshim>)
# The llama.cpp state adapter with a cache peer: llamacopy_fake_<case> (llama_copy_test.py, on the
# fake llama.cpp of tests/fakellama).
if(TARGET fakellama_host AND TARGET fakeplugin AND TARGET kvshim_llama)
  kvshim_add_py_cases(llamacopy fake ${CMAKE_CURRENT_SOURCE_DIR}/llama_copy_test.py
    LABELS integration TIMEOUT 180 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
    ARGS --host $<TARGET_FILE:fakellama_host> --plugin $<TARGET_FILE:fakeplugin>
         --preload $<TARGET_FILE:kvshim_preload> --cli $<TARGET_FILE:kvshim>)
endif()
