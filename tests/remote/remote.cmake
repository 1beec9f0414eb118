# tests/remote/remote.cmake: the remote tier (core/tiers/remote.c, design §17) against real Redis
# servers that tests/remote/servers.py starts on free loopback ports (Debian's redis-server and
# redis-tools, scripts/lib.sh). remote_test.py runs one case per test; each case starts its own
# servers and `kvshim serve` nodes (separate KVSHIM_RUN_DIRs) and stops them. Label: remote.
# Included from tests/CMakeLists.txt.
# The value format (header encode / check): no server needed.
add_executable(test_remote_value ${CMAKE_CURRENT_SOURCE_DIR}/remote/test_remote_value.c)
target_link_libraries(test_remote_value PRIVATE kvshim_core kvshim_flags PkgConfig::CRITERION
                      Threads::Threads)
add_test(NAME remote_value COMMAND test_remote_value --jobs 2)
set_tests_properties(remote_value PROPERTIES TIMEOUT 60 LABELS "unit;remote"
  ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/lsan.supp:print_suppressions=0")

find_program(KVSHIM_REDIS_SERVER redis-server)
find_program(KVSHIM_REDIS_CLI redis-cli)
if(NOT TARGET kvshim OR NOT KVSHIM_REDIS_SERVER OR NOT KVSHIM_REDIS_CLI)
  message(STATUS "kvshim: remote tests skipped: kvshim, redis-server or redis-cli missing")
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)

set(remote_extra "")
set(remote_asan_arg "")
if(KVSHIM_SANITIZE MATCHES "address")
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE remote_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${remote_asan}" AND EXISTS "${remote_asan}")
    set(remote_extra --asan-runtime ${remote_asan})
    set(remote_asan_arg --asan-runtime ${remote_asan})
  endif()
endif()
if(TARGET refengine AND TARGET kvshim_preload)
  list(APPEND remote_extra --engine $<TARGET_FILE:refengine>
                           --preload $<TARGET_FILE:kvshim_preload>)
  set(remote_cases roundtrip ttl nx corrupt evict pause breaker badinput interop cluster failover kvo)
else()
  set(remote_cases roundtrip ttl nx corrupt evict pause breaker badinput interop cluster failover)
endif()
foreach(case IN LISTS remote_cases)
  add_test(NAME remote_${case}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/remote/remote_test.py ${case}
            --cli $<TARGET_FILE:kvshim> ${remote_extra})
  set_tests_properties(remote_${case} PROPERTIES TIMEOUT 240 LABELS "remote"
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0")
  kvs_fakecuda_env(remote_${case}) # refengine (kvo, pause) runs on the fake CUDA driver
endforeach()

# The node-llama-cpp CLI across two nodes (tests/engines/llama's engine; exit 77 = skipped when
# Node.js or its node_modules cannot be prepared).
if(TARGET kvshim_preload)
  add_test(NAME remote_llama_cli
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/remote/remote_llama.py
            --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
            ${remote_asan_arg})
  set_tests_properties(remote_llama_cli PROPERTIES TIMEOUT 600 LABELS "remote"
    SKIP_RETURN_CODE 77)
endif()
