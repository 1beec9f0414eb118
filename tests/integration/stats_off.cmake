# tests/integration/stats_off.cmake: KVSHIM_STATS written when kvshim is off (runtime/runtime.c
# exit path, issue 16 item 6), on the reference engine (kvo + fake CUDA).
if(NOT TARGET refengine OR NOT TARGET kvshim_preload)
  message(STATUS "kvshim: stats_off tests skipped: refengine not built")
  return()
endif()
# stats_fake_<case> (the cases: `stats_off.py --list`).
kvshim_add_py_cases(stats fake ${CMAKE_CURRENT_SOURCE_DIR}/stats_off.py
  LABELS integration TIMEOUT 120 ASAN_RUNTIME FAKECUDA ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --engine $<TARGET_FILE:refengine> --preload $<TARGET_FILE:kvshim_preload>)
