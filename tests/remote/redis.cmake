# Redis client tests (core/tiers/redis, design §17), ctest label "remote". Included from
# tests/CMakeLists.txt. The servers are real (Debian redis-server / redis-cli, started on free
# loopback ports by tests/remote/servers.py); without them the server cases are not registered.
set(kvs_redis_dir ${CMAKE_CURRENT_SOURCE_DIR}/remote)

# URL parser and key slots: no server needed.
add_executable(test_redis_url ${kvs_redis_dir}/test_redis_url.c)
target_link_libraries(test_redis_url PRIVATE kvshim_core kvshim_flags PkgConfig::CRITERION Threads::Threads)
add_test(NAME remote_redis_url COMMAND test_redis_url --jobs 2)
set_tests_properties(remote_redis_url PROPERTIES TIMEOUT 60 LABELS "unit;remote"
  ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/lsan.supp:print_suppressions=0")

# The probe drives one handle from line commands; test_redis.py owns the servers.
add_executable(test_redis_probe ${kvs_redis_dir}/test_redis_probe.c)
target_link_libraries(test_redis_probe PRIVATE kvshim_core kvshim_flags Threads::Threads)

find_program(KVS_REDIS_SERVER redis-server)
find_program(KVS_REDIS_CLI redis-cli)
if(NOT KVS_REDIS_SERVER OR NOT KVS_REDIS_CLI)
  message(STATUS "kvshim: redis-server/redis-cli not found: remote_redis_* server tests skipped "
                 "(scripts/test installs redis-server and redis-tools)")
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(kvs_redis_cases standalone-roundtrip standalone-db standalone-pause standalone-password
    standalone-not-redis standalone-restart standalone-info cluster-roundtrip cluster-moved
    cluster-ask cluster-failover)
foreach(case IN LISTS kvs_redis_cases)
  string(REPLACE "-" "_" name "remote_redis_${case}")
  add_test(NAME ${name}
    COMMAND ${Python3_EXECUTABLE} ${kvs_redis_dir}/test_redis.py ${case} --probe $<TARGET_FILE:test_redis_probe>)
  set_tests_properties(${name} PROPERTIES TIMEOUT 120 LABELS "remote"
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/lsan.supp:print_suppressions=0")
endforeach()
