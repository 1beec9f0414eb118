# kvo hook tests (shims/kvo, design §10.1): the reference engine and a direct ABI client run
# with libkvshim.so preloaded (LD_PRELOAD set only in their own environment by kvo_test.py),
# on the fake CUDA driver. Each case gets its own temporary KVSHIM_RUN_DIR. Tests kvo_fake_<case>
# (the cases: `kvo_test.py --list`). Included from tests/integration/CMakeLists.txt.
if(NOT TARGET refengine OR NOT TARGET kvshim_preload OR NOT TARGET kvshim_kvo)
  message(STATUS "kvshim: kvo integration tests skipped: refengine or libkvshim.so not built")
  return()
endif()
# A minimal engine calling the kvo functions of libkvo_default.so (through the PLT).
add_executable(kvo_abi kvo_abi.c)
target_link_libraries(kvo_abi PRIVATE kvo_default kvshim_flags Threads::Threads ${CMAKE_DL_LIBS})

kvshim_add_py_cases(kvo fake ${CMAKE_CURRENT_SOURCE_DIR}/kvo_test.py
  LABELS integration TIMEOUT 300 ASAN_RUNTIME FAKECUDA ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --engine $<TARGET_FILE:refengine> --preload $<TARGET_FILE:kvshim_preload>
       --cli $<TARGET_FILE:kvshim> --abi $<TARGET_FILE:kvo_abi>)
