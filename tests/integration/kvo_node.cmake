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
