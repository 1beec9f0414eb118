# tests/integration/preload_hooks.cmake: KVSHIM_HOOKS=auto (runtime/hooks.c, design §11) on the
# reference engine (kvo + fake CUDA, no libllama) and on fakehost (a plugin pulling libllama in).
if(NOT TARGET refengine OR NOT TARGET fakellama_host OR NOT TARGET kvshim_preload)
  message(STATUS "kvshim: preload_hooks_auto tests skipped: refengine or fakehost not built")
  return()
endif()
# preload_fake_auto_<case> (the cases: `preload_hooks_auto.py --list`).
kvshim_add_py_cases(preload fake ${CMAKE_CURRENT_SOURCE_DIR}/preload_hooks_auto.py
  LABELS integration TIMEOUT 120 ASAN_RUNTIME FAKECUDA ENVIRONMENT ${KVSHIM_TEST_LSAN}
  ARGS --engine $<TARGET_FILE:refengine> --host $<TARGET_FILE:fakellama_host>
       --plugin $<TARGET_FILE:fakeplugin> --preload $<TARGET_FILE:kvshim_preload>)
