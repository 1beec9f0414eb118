# tests/integration: CUDA cases added by issue 14 (real-driver rules, design §9.6). Same
# program and conventions as the cuda_preload_* cases of preload.cmake.
if(NOT TARGET cuda_preload_test)
  return()
endif()
set(kc_cases host_devaccess gpa_alias unexportable bypass keep zerocopy pieces first16 freesync leases vmm ipc_free
    pin_arena)
foreach(c IN LISTS kc_cases)
  add_test(NAME cuda_preload_${c} COMMAND cuda_preload_test ${c})
  set_tests_properties(cuda_preload_${c} PROPERTIES TIMEOUT 120 LABELS "integration")
  kvs_fakecuda_env(cuda_preload_${c})
endforeach()

# Programs that link shims/cuda (not preloaded) and use the kvs_accel table:
#   cuda_capture  kvs_accel calls during another thread's global stream capture
#   cuda_ctx      contexts of kvshim's own calls: the pointer's device, never device 0 by
#                 default, nothing after the engine reset its device
#   cuda_pinro    pin_readonly: READ_ONLY where the device supports it, plain elsewhere
foreach(t capture ctx pinro)
  add_executable(cuda_${t}_test cuda_${t}_test.c ${pt_rt_objects})
  target_link_libraries(cuda_${t}_test PRIVATE preload_testutil)
  set_target_properties(cuda_${t}_test PROPERTIES INSTALL_RPATH "$ORIGIN"
    BUILD_WITH_INSTALL_RPATH ON)
  add_test(NAME cuda_${t} COMMAND cuda_${t}_test)
  set_tests_properties(cuda_${t} PROPERTIES TIMEOUT 60 LABELS "integration")
  kvs_fakecuda_env(cuda_${t})
endforeach()

# Driver facts as strict verdicts (scripts/gpu-check step "facts"): on the fake here.
add_executable(cuda_facts cuda_facts.c)
target_include_directories(cuda_facts PRIVATE ${PROJECT_SOURCE_DIR}/shims/cuda)
target_link_libraries(cuda_facts PRIVATE kvshim_fakecuda kvshim_flags kvshim_cuda_headers
  ${CMAKE_DL_LIBS})
set_target_properties(cuda_facts PROPERTIES INSTALL_RPATH "$ORIGIN" BUILD_WITH_INSTALL_RPATH ON)
add_test(NAME cuda_facts COMMAND cuda_facts)
set_tests_properties(cuda_facts PROPERTIES TIMEOUT 60 LABELS "integration")
kvs_fakecuda_env(cuda_facts)
add_test(NAME cuda_facts_alias COMMAND cuda_facts)
set_tests_properties(cuda_facts_alias PROPERTIES TIMEOUT 60 LABELS "integration" WILL_FAIL ON
  ENVIRONMENT "FAKECUDA_GPA_ALIAS=1")
kvs_fakecuda_env(cuda_facts_alias)
# The per-version check can fail: answers that are no exported symbol are refused at every
# version asked (the pass is the FAIL line, whatever the exit status).
add_test(NAME cuda_facts_alias_versions COMMAND cuda_facts)
set_tests_properties(cuda_facts_alias_versions PROPERTIES TIMEOUT 60 LABELS "integration"
  ENVIRONMENT "FAKECUDA_GPA_ALIAS=1"
  PASS_REGULAR_EXPRESSION "versions cuMemHostAlloc [(]default[)]: 2000:none 2020:unknown[^\n]* -> FAIL")
kvs_fakecuda_env(cuda_facts_alias_versions)

# Benchmark (not a test): large cuMemHostAlloc calls, the driver's against kvshim's host arena
# with pinning ahead of use (issue 14 item 6). Run:
#   build/tests/cuda_hostalloc_bench --compare build/preload/libkvshim.so --mib 256 --count 6
add_executable(cuda_hostalloc_bench cuda_hostalloc_bench.c)
target_link_libraries(cuda_hostalloc_bench PRIVATE kvshim_fakecuda kvshim_flags kvshim_cuda_headers)
set_target_properties(cuda_hostalloc_bench PROPERTIES INSTALL_RPATH "$ORIGIN"
  BUILD_WITH_INSTALL_RPATH ON)

# What scripts/gpu-check --pack carries has no build-machine path (RUNPATH $ORIGIN or none,
# libcudart next to the program that needs it): the files it copies out of this build.
add_test(NAME gpu_pack_runpath COMMAND ${CMAKE_COMMAND} -DREADELF=${CMAKE_READELF}
  -DSCRIPT=${PROJECT_SOURCE_DIR}/scripts/gpu-check -DBUILD=${PROJECT_BINARY_DIR}
  -P ${CMAKE_CURRENT_SOURCE_DIR}/check_runpath.cmake)
set_tests_properties(gpu_pack_runpath PROPERTIES TIMEOUT 60 LABELS "integration")

# A required step that is skipped fails the run (issue 23): with a 1 s deadline every step is
# skipped, and scripts/gpu-check must exit 1 with the skips in its summary (the full run, where
# only torch is skipped and marked optional, passes: scripts/test).
add_test(NAME gpu_check_skip_fails COMMAND bash -c
  "out=$(mktemp -d) && KVS_GPU_DEADLINE=1 '${PROJECT_SOURCE_DIR}/scripts/gpu-check' --fake \
   --build-dir '${PROJECT_BINARY_DIR}' --out \"$out\" >/dev/null 2>&1; rc=$?; \
   grep -q '^facts *SKIP: past the 1s deadline' \"$out/summary.txt\"; found=$?; rm -rf \"$out\"; \
   [ $rc -eq 1 ] && [ $found -eq 0 ]")
set_tests_properties(gpu_check_skip_fails PROPERTIES TIMEOUT 60 LABELS "integration")
