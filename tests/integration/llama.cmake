# tests/integration/llama.cmake: the llama.cpp state API adapter (shims/llama, design §10.2) on
# tests/fakellama. llama_shim.py runs fakehost (which opens libfakeplugin.so RTLD_LOCAL, as
# Node opens an addon) with and without LD_PRELOAD=libkvshim.so, set only in the environment of
# the processes it starts; each case has its own temporary KVSHIM_RUN_DIR. Included from
# tests/integration/CMakeLists.txt.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim_llama OR NOT TARGET fakellama_host)
  message(STATUS "kvshim: llama integration tests skipped: libkvshim.so or fakellama not built")
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)

set(llama_test_extra "")
if(KVSHIM_SANITIZE MATCHES "address")
  # The sanitizer runtime must come first in LD_PRELOAD (fakehost is not instrumented).
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE llama_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${llama_asan}" AND EXISTS "${llama_asan}")
    set(llama_test_extra --asan-runtime ${llama_asan})
  endif()
endif()

set(llama_test_cases roundtrip write-through-off peer serve fingerprint corrupt same-as-real
    rtld-local stale overwrite fallbacks disabled ctypes)
foreach(case IN LISTS llama_test_cases)
  string(REPLACE "-" "_" name "llama_shim_${case}")
  add_test(NAME ${name}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/llama_shim.py ${case}
            --host $<TARGET_FILE:fakellama_host> --plugin $<TARGET_FILE:fakeplugin>
            --preload $<TARGET_FILE:kvshim_preload> --cli $<TARGET_FILE:kvshim>
            ${llama_test_extra})
  set_tests_properties(${name} PROPERTIES TIMEOUT 180 LABELS "integration"
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0")
endforeach()
