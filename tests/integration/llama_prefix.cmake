# tests/integration/llama_prefix.cmake: the transparent llama.cpp prefix cache (shims/llama/
# prefix.c, design §10.3) on tests/fakellama's prefixhost. llama_prefix.py runs each script with
# and without LD_PRELOAD=libkvshim.so (set only in the engine processes' environment, each case
# in its own KVSHIM_RUN_DIR) and requires identical outputs. Included from
# tests/integration/CMakeLists.txt.
if(NOT TARGET kvshim_preload OR NOT TARGET fakellama_prefixhost OR NOT TARGET kvshim)
  message(STATUS "kvshim: llama prefix tests skipped: libkvshim.so or prefixhost not built")
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)

set(llama_prefix_extra "")
if(KVSHIM_SANITIZE MATCHES "address")
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE llama_prefix_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${llama_prefix_asan}" AND EXISTS "${llama_prefix_asan}")
    set(llama_prefix_extra --asan-runtime ${llama_prefix_asan})
  endif()
endif()

set(llama_prefix_cases local sequences peer serve divergence faults faults-peer taint offload
    disabled)
foreach(case IN LISTS llama_prefix_cases)
  string(REPLACE "-" "_" name "llama_prefix_${case}")
  add_test(NAME ${name}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/llama_prefix.py ${case}
            --host $<TARGET_FILE:fakellama_prefixhost> --preload $<TARGET_FILE:kvshim_preload>
            --cli $<TARGET_FILE:kvshim> ${llama_prefix_extra})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "integration"
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0")
endforeach()
