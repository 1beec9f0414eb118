# tests/integration/inspect.cmake: `kvshim inspect` and the run-time family scan (design.md §11).
#
# Purpose-built fixtures (tests/integration/inspect/) cover each way a call can or cannot be
# interposed. check_inspect.py runs each fixture with an LD_PRELOAD probe that overrides the
# hook and records whether the override was called, and requires inspect's verdict to match
# that empirical result (and the reason expected for the case). The loader's own view
# (LD_TRACE_LOADED_OBJECTS) checks the resolved closure. Fixtures are built without the
# sanitizers (they are preloaded into / run as plain programs) but with -Werror.
if(NOT TARGET kvshim OR NOT TARGET kvshim_elfscan)
  message(STATUS "kvshim: inspect tests skipped: kvshim or kvshim_elfscan missing")
  return()
endif()
include(CheckCSourceCompiles)

set(fx_src ${CMAKE_CURRENT_LIST_DIR}/inspect)
set(fx_dir ${CMAKE_CURRENT_BINARY_DIR}/inspect-fx)

# kvs_fx(<target> EXEC|SHARED <source> [RPATH|RUNPATH|NONE])
function(kvs_fx target kind source)
  set(mode "${ARGN}")
  if(kind STREQUAL "EXEC")
    add_executable(${target} ${fx_src}/${source})
  else()
    add_library(${target} SHARED ${fx_src}/${source})
  endif()
  target_include_directories(${target} PRIVATE ${fx_src} ${PROJECT_SOURCE_DIR}/shims/kvo/include)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror -O2)
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${fx_dir}
    LIBRARY_OUTPUT_DIRECTORY ${fx_dir} BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "$ORIGIN")
  if(mode STREQUAL "NONE")
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "" SKIP_BUILD_RPATH ON)
  elseif(mode STREQUAL "RPATH")
    target_link_options(${target} PRIVATE "LINKER:--disable-new-dtags")
  elseif(mode STREQUAL "RUNPATH")
    target_link_options(${target} PRIVATE "LINKER:--enable-new-dtags")
  endif()
endfunction()

# llama_decode defined in a library and called by its fx_run(), linked five ways
kvs_fx(fx_plt SHARED fx_llama_lib.c)
kvs_fx(fx_symbolic SHARED fx_llama_lib.c)
target_link_options(fx_symbolic PRIVATE "LINKER:-Bsymbolic")
kvs_fx(fx_symfn SHARED fx_llama_lib.c)
target_link_options(fx_symfn PRIVATE "LINKER:-Bsymbolic-functions")
kvs_fx(fx_hidden SHARED fx_llama_lib.c)
target_compile_definitions(fx_hidden PRIVATE FX_VIS="hidden")
kvs_fx(fx_protected SHARED fx_llama_lib.c)
target_compile_definitions(fx_protected PRIVATE FX_VIS="protected")
foreach(v plt symbolic symfn hidden protected)
  kvs_fx(fx_${v}_main EXEC fx_run_main.c RPATH)
  target_link_libraries(fx_${v}_main PRIVATE fx_${v})
endforeach()
# both routes at once: the executable's own PLT call and the library's bound one
kvs_fx(fx_partial_main EXEC fx_run_main.c RPATH)
target_compile_definitions(fx_partial_main PRIVATE FX_ALSO_DIRECT)
target_link_libraries(fx_partial_main PRIVATE fx_symfn)
kvs_fx(fx_partial_prot_main EXEC fx_run_main.c RPATH)
target_compile_definitions(fx_partial_prot_main PRIVATE FX_ALSO_DIRECT)
target_link_libraries(fx_partial_prot_main PRIVATE fx_protected)

# kvo_lookup: a PLT import; the same reached through a library with no RPATH of its own
kvs_fx(fx_kvo SHARED fx_kvo_lib.c)
kvs_fx(fx_kvo_main EXEC fx_kvo_main.c)
target_link_libraries(fx_kvo_main PRIVATE fx_kvo)
kvs_fx(fx_mid SHARED fx_mid_lib.c NONE)
target_link_libraries(fx_mid PRIVATE fx_kvo)
kvs_fx(fx_chain_rpath EXEC fx_kvo_main.c RPATH)
kvs_fx(fx_chain_runpath EXEC fx_kvo_main.c RUNPATH)
foreach(t fx_chain_rpath fx_chain_runpath)
  target_compile_definitions(${t} PRIVATE FX_VIA_MID)
  target_link_libraries(${t} PRIVATE fx_mid)
  # the link itself must find libfx_kvo.so (libfx_mid.so has no path to it)
  target_link_options(${t} PRIVATE "LINKER:-rpath-link,${fx_dir}")
endforeach()

# an executable defining llama_decode and calling it: static (when libc.a exists) and dynamic
set(CMAKE_REQUIRED_LINK_OPTIONS -static)
check_c_source_compiles("#include <stdio.h>\nint main(void) { puts(\"x\"); return 0; }"
  KVSHIM_HAVE_STATIC_LIBC)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
kvs_fx(fx_static EXEC fx_self_main.c)
set_target_properties(fx_static PROPERTIES POSITION_INDEPENDENT_CODE OFF)
if(KVSHIM_HAVE_STATIC_LIBC)
  target_link_options(fx_static PRIVATE -static)
  set(fx_static_mode static)
else()
  target_link_options(fx_static PRIVATE -no-pie)
  set(fx_static_mode nopie)
endif()
kvs_fx(fx_selfdyn EXEC fx_self_main.c)

# kvo_lookup defined in the executable, called from its library
kvs_fx(fx_cb SHARED fx_cb_lib.c)
kvs_fx(fx_cb_main EXEC fx_cb_main.c)
target_link_libraries(fx_cb_main PRIVATE fx_cb)

# a plugin opened RTLD_LOCAL, linking the library that defines llama_state_seq_save_file
kvs_fx(fx_state SHARED fx_state_lib.c)
kvs_fx(fx_plugin SHARED fx_plugin.c RUNPATH)
target_link_libraries(fx_plugin PRIVATE fx_state)
kvs_fx(fx_host EXEC fx_host.c)
target_link_libraries(fx_host PRIVATE ${CMAKE_DL_LIBS})

# the LD_PRELOAD probe
kvs_fx(fx_probe SHARED probe.c)
target_link_libraries(fx_probe PRIVATE ${CMAKE_DL_LIBS})

# a relocatable object (.o) for the bad-input case
add_library(fx_kvo_obj OBJECT ${fx_src}/fx_kvo_lib.c)
target_include_directories(fx_kvo_obj PRIVATE ${fx_src} ${PROJECT_SOURCE_DIR}/shims/kvo/include)

# inspect_fake_<case> (the cases: `check_inspect.py --list`); the refengine case needs refengine
# and the fake CUDA driver.
set(inspect_args --kvshim $<TARGET_FILE:kvshim> --dir ${fx_dir} --probe $<TARGET_FILE:fx_probe>
    --static-mode ${fx_static_mode} --object $<TARGET_OBJECTS:fx_kvo_obj>)
set(inspect_env ASAN_OPTIONS=verify_asan_link_order=0 ${KVSHIM_TEST_LSAN})
kvshim_add_py_cases(inspect fake ${fx_src}/check_inspect.py EXCLUDE refengine
  LABELS integration inspect TIMEOUT 120 ENVIRONMENT ${inspect_env} ARGS ${inspect_args})
if(TARGET refengine)
  kvshim_add_py_cases(inspect fake ${fx_src}/check_inspect.py ONLY refengine FAKECUDA
    LABELS integration inspect TIMEOUT 120 ENVIRONMENT ${inspect_env}
    ARGS ${inspect_args} --refengine $<TARGET_FILE:refengine>)
endif()

# The hooks inspect checks == the library's exports (nm -D) == preload/exports.txt (the oracle).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
get_property(inspect_exports_txt GLOBAL PROPERTY KVSHIM_PRELOAD_EXPORTS)
add_test(NAME inspect_exports COMMAND ${Python3_EXECUTABLE}
  ${CMAKE_CURRENT_LIST_DIR}/inspect_exports.py --kvshim $<TARGET_FILE:kvshim>
  --lib $<TARGET_FILE:kvshim_preload> --exports ${inspect_exports_txt} --nm ${CMAKE_NM})
set_tests_properties(inspect_exports PROPERTIES TIMEOUT 120 LABELS "integration;inspect")
