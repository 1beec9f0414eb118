# tests/integration: CUDA cases added by issue 14 (real-driver rules, design §9.6). Same
# program and conventions as the cuda_preload_* cases of preload.cmake.
if(NOT TARGET cuda_preload_test)
  return()
endif()
set(kc_cases host_devaccess gpa_alias)
foreach(c IN LISTS kc_cases)
  add_test(NAME cuda_preload_${c} COMMAND cuda_preload_test ${c})
  set_tests_properties(cuda_preload_${c} PROPERTIES TIMEOUT 120 LABELS "integration")
  kvs_fakecuda_env(cuda_preload_${c})
endforeach()
