# Redis client without staging copies (core/tiers/redis, issue 12 item 3), ctest label "remote":
# arguments given in parts, against a real redis-server (servers.py, free loopback port).
add_executable(test_redis_zcopy ${CMAKE_CURRENT_SOURCE_DIR}/remote/test_redis_zcopy.c)
target_link_libraries(test_redis_zcopy PRIVATE kvshim_core kvshim_flags Threads::Threads)
find_program(KVS_ZCOPY_REDIS_SERVER redis-server)
find_program(KVS_ZCOPY_REDIS_CLI redis-cli)
if(KVS_ZCOPY_REDIS_SERVER AND KVS_ZCOPY_REDIS_CLI)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  add_test(NAME remote_redis_zcopy
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/remote/test_redis_zcopy.py
            $<TARGET_FILE:test_redis_zcopy>)
  set_tests_properties(remote_redis_zcopy PROPERTIES TIMEOUT 180 LABELS "remote"
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/lsan.supp:print_suppressions=0")
endif()
