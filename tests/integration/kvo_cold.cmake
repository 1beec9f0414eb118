# Cold-start load path of the kvo hooks (shims/kvo: a load copies from the peer kvo_lookup found,
# the local copy is kept behind the engine; its fallback when that peer is gone): kvo_cold, a
# direct ABI client, driven by kvo_cold_test.py. Tests kvocold_fake_<case>. Included from
# tests/integration/CMakeLists.txt.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim_kvo OR NOT TARGET kvo_default)
  message(STATUS "kvshim: kvo cold-start tests skipped: libkvshim.so or libkvo_default not built")
  return()
endif()
add_executable(kvo_cold kvo_cold.c)
target_link_libraries(kvo_cold PRIVATE kvo_default kvshim_flags)

kvshim_add_py_cases(kvocold fake ${CMAKE_CURRENT_SOURCE_DIR}/kvo_cold_test.py
  LABELS integration TIMEOUT 120 ASAN_RUNTIME FAKECUDA ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --preload $<TARGET_FILE:kvshim_preload> --client $<TARGET_FILE:kvo_cold>)
