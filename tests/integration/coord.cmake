# coordinator, peers and CLI tests (included by tests/integration/CMakeLists.txt).
#   coord_client.c        shared raw protocol client + in-process server helpers
#   coord_ops             every opcode, both strategies, the seed's flows, the peer API (Criterion)
#   coord_badinput        malformed frames, bad slots, other uids, file modes (Criterion)
#   coord_faults          peers SIGKILLed at each step, server stopped/killed, stale sockets
#   coord_push            write-behind to a `kvshim serve` cache peer (runs the kvshim binary)
#   coord_stress          8 peer processes x thousands of mixed operations (plain program:
#                         the TSan leg runs it with ctest -L stress)
#   coord_cli             the kvshim CLI end to end (cli_test.sh)
set(kvs_coordtest_dir ${CMAKE_CURRENT_SOURCE_DIR})
set(kvs_coordtest_env "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/../lsan.supp:print_suppressions=0")

add_library(kvs_coord_client STATIC ${kvs_coordtest_dir}/coord_client.c)
target_link_libraries(kvs_coord_client PUBLIC kvshim_core PRIVATE kvshim_flags)
target_include_directories(kvs_coord_client PUBLIC ${kvs_coordtest_dir})

function(kvs_coordtest_criterion name)
  add_executable(${name} ${kvs_coordtest_dir}/${name}.c)
  target_link_libraries(${name} PRIVATE kvs_coord_client kvshim_core kvshim_flags
    PkgConfig::CRITERION Threads::Threads)
  add_test(NAME ${name} COMMAND ${name} --jobs 1)
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "integration"
    ENVIRONMENT "${kvs_coordtest_env}")
endfunction()

kvs_coordtest_criterion(coord_ops)
kvs_coordtest_criterion(coord_badinput)
kvs_coordtest_criterion(coord_faults)
kvs_coordtest_criterion(coord_push)
target_compile_definitions(coord_push PRIVATE KVSHIM_BIN="$<TARGET_FILE:kvshim>")
add_dependencies(coord_push kvshim)

add_executable(coord_stress ${kvs_coordtest_dir}/coord_stress.c)
target_link_libraries(coord_stress PRIVATE kvs_coord_client kvshim_core kvshim_flags Threads::Threads)
if(KVSHIM_SANITIZE MATCHES "thread")
  set(kvs_coordtest_stress_args --ops 8000)
else()
  set(kvs_coordtest_stress_args --ops 20000)
endif()
add_test(NAME coord_stress COMMAND coord_stress ${kvs_coordtest_stress_args})
set_tests_properties(coord_stress PROPERTIES TIMEOUT 600 LABELS "integration;stress"
  ENVIRONMENT "${kvs_coordtest_env}")

add_test(NAME coord_cli COMMAND bash ${kvs_coordtest_dir}/cli_test.sh $<TARGET_FILE:kvshim>)
set_tests_properties(coord_cli PROPERTIES TIMEOUT 120 LABELS "integration"
  ENVIRONMENT "${kvs_coordtest_env}")
