# kvo hook tests (shims/kvo, design §10.1): the reference engine and a direct ABI client run
# with libkvshim.so preloaded (LD_PRELOAD set only in their own environment by kvo_test.py),
# on the fake CUDA driver. Each case gets its own temporary KVSHIM_RUN_DIR. Included from
# tests/integration/CMakeLists.txt.
if(NOT TARGET refengine OR NOT TARGET kvshim_preload OR NOT TARGET kvshim_kvo)
  message(STATUS "kvshim: kvo integration tests skipped: refengine or libkvshim.so not built")
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)

# A minimal engine calling the kvo functions of libkvo_default.so (through the PLT).
add_executable(kvo_abi kvo_abi.c)
target_link_libraries(kvo_abi PRIVATE kvo_default kvshim_flags Threads::Threads ${CMAKE_DL_LIBS})

set(kvo_test_extra "")
if(KVSHIM_SANITIZE MATCHES "address")
  # The sanitizer runtime must come first in LD_PRELOAD for instrumented engines.
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE kvo_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${kvo_asan}" AND EXISTS "${kvo_asan}")
    set(kvo_test_extra --asan-runtime ${kvo_asan})
  endif()
endif()

set(kvo_test_cases abi peer-device peer-host salt serve disabled pool-full pool-small kill
    hooks-kvo-only)
foreach(case IN LISTS kvo_test_cases)
  string(REPLACE "-" "_" name "kvo_${case}")
  add_test(NAME ${name}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/kvo_test.py ${case}
            --engine $<TARGET_FILE:refengine> --preload $<TARGET_FILE:kvshim_preload>
            --cli $<TARGET_FILE:kvshim> --abi $<TARGET_FILE:kvo_abi> ${kvo_test_extra})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "integration"
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0")
  kvs_fakecuda_env(${name})
endforeach()
