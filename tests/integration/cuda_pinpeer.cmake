# tests/integration: a cache peer's pool mapping registered with the driver in the background
# and unregistered before it is unmapped (issue 14 item 7): cuda_pinpeer_test, linked with the
# runtime and shims/cuda (not preloaded), against a `kvshim serve` and the fake driver.
if(NOT TARGET cuda_preload_test OR NOT TARGET kvshim)
  return()
endif()
get_property(pp_rt_objects GLOBAL PROPERTY KVSHIM_PRELOAD_RT_OBJECTS)
add_executable(cuda_pinpeer_test cuda_pinpeer_test.c ${pp_rt_objects})
target_link_libraries(cuda_pinpeer_test PRIVATE preload_testutil)
target_include_directories(cuda_pinpeer_test PRIVATE ${PROJECT_SOURCE_DIR}/runtime)
set_target_properties(cuda_pinpeer_test PROPERTIES INSTALL_RPATH "$ORIGIN"
  BUILD_WITH_INSTALL_RPATH ON)
add_test(NAME cuda_pinpeer COMMAND cuda_pinpeer_test $<TARGET_FILE:kvshim>)
set_tests_properties(cuda_pinpeer PROPERTIES TIMEOUT 120 LABELS "integration")
kvs_fakecuda_env(cuda_pinpeer)
