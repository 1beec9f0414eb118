# tests/runtime: the runtime's own tests (runtime/). Included from tests/CMakeLists.txt after
# tests/integration (the in-process coordinators of coord_client.c).
#   test_cache   the cache facade (runtime/cache.c, design §3.7): tier order, one copy per node,
#                keep-behind and the fallbacks, against in-process coordinators (a cache peer
#                and an engine peer) and a runtime built around a third (Criterion)
if(NOT TARGET kvs_coord_client)
  return()
endif()
add_executable(test_cache ${CMAKE_CURRENT_LIST_DIR}/test_cache.c
  $<TARGET_OBJECTS:kvshim_runtime>)
target_include_directories(test_cache PRIVATE ${PROJECT_SOURCE_DIR}/runtime)
target_link_libraries(test_cache PRIVATE kvs_coord_client kvshim_core kvshim_flags
  PkgConfig::CRITERION Threads::Threads ${CMAKE_DL_LIBS})
add_test(NAME test_cache COMMAND test_cache --jobs 1)
set_tests_properties(test_cache PROPERTIES TIMEOUT 300 LABELS "unit"
  ENVIRONMENT "${KVSHIM_TEST_LSAN}")

# layering_cache: no shim reaches the store, the pool (shims/cuda excepted) or the peer client
# past the facade, and core's layers (base, memory, wire, tiers) include one way (a source
# scan, check_layering.py).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME layering_cache
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_layering.py ${PROJECT_SOURCE_DIR})
set_tests_properties(layering_cache PROPERTIES TIMEOUT 60 LABELS "unit")
