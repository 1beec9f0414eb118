# One copy per node (issue 13, design §3.5): refengine processes and `kvshim serve` in one group
# (kvo_node_test.py). Tests kvo_node_<case> (the cases: `kvo_node_test.py --list`). Included
# from tests/integration/CMakeLists.txt.
if(NOT TARGET refengine OR NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  message(STATUS "kvshim: kvo node tests skipped: refengine, libkvshim.so or kvshim not built")
  return()
endif()
kvshim_add_py_cases(kvo node ${CMAKE_CURRENT_SOURCE_DIR}/kvo_node_test.py
  LABELS integration TIMEOUT 300 ASAN_RUNTIME FAKECUDA ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --engine $<TARGET_FILE:refengine> --preload $<TARGET_FILE:kvshim_preload>
       --cli $<TARGET_FILE:kvshim>)
# The llama.cpp state adapter with a cache peer: llamanode_fake_<case> (llama_node_test.py, on the
# fake llama.cpp of tests/fakellama).
if(TARGET fakellama_host AND TARGET fakeplugin AND TARGET kvshim_llama)
  kvshim_add_py_cases(llamanode fake ${CMAKE_CURRENT_SOURCE_DIR}/llama_node_test.py
    LABELS integration TIMEOUT 180 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
    ARGS --host $<TARGET_FILE:fakellama_host> --plugin $<TARGET_FILE:fakeplugin>
         --preload $<TARGET_FILE:kvshim_preload> --cli $<TARGET_FILE:kvshim>)
endif()
