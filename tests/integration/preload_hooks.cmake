# tests/integration/preload_hooks.cmake: KVSHIM_HOOKS=auto (runtime/hooks.c, design §11) on the
# reference engine (kvo + fake CUDA, no libllama) and on fakehost (a plugin pulling libllama in).
if(NOT TARGET refengine OR NOT TARGET fakellama_host OR NOT TARGET kvshim_preload)
  message(STATUS "kvshim: preload_hooks_auto tests skipped: refengine or fakehost not built")
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)
kvshim_asan_runtime(hooks_asan) # the sanitizer runtime must come first in LD_PRELOAD
set(hooks_extra "")
if(hooks_asan)
  set(hooks_extra --asan-runtime ${hooks_asan})
endif()
foreach(case without-llama with-llama explicit)
  string(REPLACE "-" "_" name "preload_hooks_auto_${case}")
  add_test(NAME ${name}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/preload_hooks_auto.py ${case}
            --engine $<TARGET_FILE:refengine> --host $<TARGET_FILE:fakellama_host>
            --plugin $<TARGET_FILE:fakeplugin> --preload $<TARGET_FILE:kvshim_preload>
            ${hooks_extra})
  set_tests_properties(${name} PROPERTIES TIMEOUT 120 LABELS "integration"
    ENVIRONMENT "${KVSHIM_TEST_LSAN}")
  kvs_fakecuda_env(${name})
endforeach()
