# tests/integration/preload.cmake: libkvshim.so and its CUDA hooks (design §9, §15).
# Every program here is a parent that sets LD_PRELOAD only in the environment of the helpers it
# starts; ctest and the test programs themselves are never preloaded. Each test makes its own
# temporary directory (run directory, stats, driver log) and removes it when it passes.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim_fakecuda)
  message(STATUS "kvshim: preload tests skipped (no libkvshim.so or fake driver target)")
  return()
endif()

set(pt_defs "PT_PRELOAD_LIB=\"$<TARGET_FILE:kvshim_preload>\"")
# The sanitizer runtime must come first in LD_PRELOAD for instrumented children.
kvshim_asan_runtime(pt_asan)
if(pt_asan)
  list(APPEND pt_defs "PT_ASAN_RUNTIME=\"${pt_asan}\"")
endif()

# Helper libraries of the dlsym test: A and B both define pt_probe; the plugin (opened
# RTLD_LOCAL) depends on a library only it can see.
add_library(preload_dlsym_a SHARED preload_dlsym_a.c)
add_library(preload_dlsym_b SHARED preload_dlsym_b.c)
add_library(preload_dlsym_dep SHARED preload_dlsym_dep.c)
add_library(preload_dlsym_plugin SHARED preload_dlsym_plugin.c)
foreach(t preload_dlsym_a preload_dlsym_b preload_dlsym_dep preload_dlsym_plugin)
  target_link_libraries(${t} PRIVATE kvshim_flags ${CMAKE_DL_LIBS})
  # Their dlsym calls must stay real calls: a tail call would make the caller's caller the
  # object glibc sees.
  target_compile_options(${t} PRIVATE -fno-optimize-sibling-calls)
endforeach()
target_link_libraries(preload_dlsym_plugin PRIVATE preload_dlsym_dep)
list(APPEND pt_defs "PT_PLUGIN_PATH=\"$<TARGET_FILE:preload_dlsym_plugin>\""
                    "PT_LIBB_PATH=\"$<TARGET_FILE:preload_dlsym_b>\"")

add_library(preload_testutil STATIC preload_testutil.c)
target_compile_definitions(preload_testutil PUBLIC ${pt_defs})
target_include_directories(preload_testutil PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(preload_testutil PUBLIC kvshim_core kvshim_flags kvshim_cuda_headers
  kvshim_fakecuda Threads::Threads ${CMAKE_DL_LIBS})
add_dependencies(preload_testutil kvshim_preload preload_dlsym_plugin)

# The CUDA cases: one parent program, one test per case.
add_executable(cuda_preload_test cuda_preload_test.c)
target_link_libraries(cuda_preload_test PRIVATE preload_testutil)
# The second process of device_ipc: shims/cuda linked in, not preloaded.
get_property(pt_rt_objects GLOBAL PROPERTY KVSHIM_PRELOAD_RT_OBJECTS)
add_executable(cuda_ipc_reader cuda_ipc_reader.c ${pt_rt_objects})
target_link_libraries(cuda_ipc_reader PRIVATE preload_testutil)
add_dependencies(cuda_preload_test cuda_ipc_reader)
# No build RUNPATH to the fake driver: ctest selects it with LD_LIBRARY_PATH (kvs_fakecuda_env),
# scripts/gpu-check runs the same binaries on the real driver. $ORIGIN finds the helper libraries.
set_target_properties(cuda_preload_test cuda_ipc_reader PROPERTIES INSTALL_RPATH "$ORIGIN"
  BUILD_WITH_INSTALL_RPATH ON)

set(pt_cases host_pool arena_full device_ipc enable0 failopen initfail_rundir initfail_pool
  peers0 fork threads notouch gpa)
foreach(c IN LISTS pt_cases)
  add_test(NAME cuda_preload_${c} COMMAND cuda_preload_test ${c})
  set_tests_properties(cuda_preload_${c} PROPERTIES TIMEOUT 120 LABELS "integration")
  kvs_fakecuda_env(cuda_preload_${c})
endforeach()

# dlsym pass-through (RTLD_NEXT / RTLD_DEFAULT / handles from several callers).
add_executable(preload_dlsym_test preload_dlsym_test.c)
target_link_libraries(preload_dlsym_test PRIVATE preload_testutil preload_dlsym_a preload_dlsym_b)
add_test(NAME preload_dlsym COMMAND preload_dlsym_test)
set_tests_properties(preload_dlsym PROPERTIES TIMEOUT 120 LABELS "integration")
set_target_properties(preload_dlsym_test PROPERTIES INSTALL_RPATH "$ORIGIN"
  BUILD_WITH_INSTALL_RPATH ON)
kvs_fakecuda_env(preload_dlsym)

# The runtime's resolvers, linked directly.
add_executable(preload_resolve_test preload_resolve_test.c ${pt_rt_objects})
target_link_libraries(preload_resolve_test PRIVATE preload_testutil)
target_include_directories(preload_resolve_test PRIVATE ${PROJECT_SOURCE_DIR}/runtime)
set_target_properties(preload_resolve_test PROPERTIES INSTALL_RPATH "$ORIGIN"
  BUILD_WITH_INSTALL_RPATH ON)
add_test(NAME preload_resolve COMMAND preload_resolve_test)
set_tests_properties(preload_resolve PROPERTIES TIMEOUT 60 LABELS "integration")
kvs_fakecuda_env(preload_resolve)

# A CUDA runtime program, against the toolkit's libcudart, shared and static (when present).
get_filename_component(pt_cuda_root "${KVSHIM_CUDA_INCLUDE_DIR}" DIRECTORY)
find_library(KVSHIM_CUDART_SHARED NAMES cudart PATHS ${pt_cuda_root}/lib64 ${pt_cuda_root}/lib
  NO_DEFAULT_PATH)
find_library(KVSHIM_CUDART_STATIC NAMES libcudart_static.a PATHS ${pt_cuda_root}/lib64
  ${pt_cuda_root}/lib NO_DEFAULT_PATH)
foreach(kind shared static)
  string(TOUPPER ${kind} K)
  if(NOT KVSHIM_CUDART_${K})
    message(STATUS "kvshim: no ${kind} libcudart next to ${KVSHIM_CUDA_INCLUDE_DIR}: cuda_cudart_${kind} skipped")
    continue()
  endif()
  add_executable(cuda_cudart_${kind} cuda_cudart_prog.c)
  target_link_libraries(cuda_cudart_${kind} PRIVATE kvshim_cuda_headers ${KVSHIM_CUDART_${K}})
  if(kind STREQUAL "static")
    target_link_libraries(cuda_cudart_${kind} PRIVATE ${CMAKE_DL_LIBS} Threads::Threads rt)
  else()
    # No build-machine path in the program (scripts/gpu-check carries it to a GPU machine:
    # test gpu_pack_runpath): the toolkit's libcudart is copied next to it, under its soname,
    # and found through $ORIGIN, here and in the packed directory.
    file(REAL_PATH "${KVSHIM_CUDART_${K}}" pt_cudart_real)
    get_filename_component(pt_cudart_name "${pt_cudart_real}" NAME)
    string(REGEX MATCH "^libcudart\\.so\\.[0-9]+" pt_cudart_soname "${pt_cudart_name}")
    if(NOT pt_cudart_soname)
      set(pt_cudart_soname "${pt_cudart_name}")
    endif()
    set_target_properties(cuda_cudart_${kind} PROPERTIES INSTALL_RPATH "$ORIGIN"
      BUILD_WITH_INSTALL_RPATH ON)
    add_custom_command(TARGET cuda_cudart_${kind} POST_BUILD
      COMMAND ${CMAKE_COMMAND} -E copy_if_different "${pt_cudart_real}"
              "$<TARGET_FILE_DIR:cuda_cudart_${kind}>/${pt_cudart_soname}"
      VERBATIM)
  endif()
  add_dependencies(cuda_preload_test cuda_cudart_${kind})
  add_test(NAME cuda_preload_cudart_${kind}
    COMMAND cuda_preload_test cudart $<TARGET_FILE:cuda_cudart_${kind}>)
  set_tests_properties(cuda_preload_cudart_${kind} PROPERTIES TIMEOUT 120 LABELS "integration")
  kvs_fakecuda_env(cuda_preload_cudart_${kind})
endforeach()

# Copy bandwidth from a pinned host buffer (the driver's, or kvshim's host arena when
# preloaded): a correctness smoke test here, the figures on a real GPU in scripts/gpu-check.
add_executable(cuda_bandwidth cuda_bandwidth.c)
target_link_libraries(cuda_bandwidth PRIVATE kvshim_fakecuda kvshim_flags kvshim_cuda_headers)
set_target_properties(cuda_bandwidth PROPERTIES INSTALL_RPATH "$ORIGIN" BUILD_WITH_INSTALL_RPATH ON)
add_dependencies(cuda_preload_test cuda_bandwidth)
add_test(NAME cuda_preload_bandwidth COMMAND cuda_preload_test bandwidth $<TARGET_FILE:cuda_bandwidth> 4)
set_tests_properties(cuda_preload_bandwidth PROPERTIES TIMEOUT 120 LABELS "integration")
kvs_fakecuda_env(cuda_preload_bandwidth)

# Static checks of the library itself.
set(pt_check ${CMAKE_CURRENT_SOURCE_DIR}/preload_check_elf.cmake)
get_property(pt_exports GLOBAL PROPERTY KVSHIM_PRELOAD_EXPORTS)
add_test(NAME preload_exports COMMAND ${CMAKE_COMMAND} -DMODE=exports -DNM=${CMAKE_NM}
  -DLIB=$<TARGET_FILE:kvshim_preload> -DEXPECTED=${pt_exports} -P ${pt_check})
add_test(NAME preload_no_public_dlsym COMMAND ${CMAKE_COMMAND} -DMODE=imports -DNM=${CMAKE_NM}
  -DOBJDUMP=${CMAKE_OBJDUMP} -DLIB=$<TARGET_FILE:kvshim_preload> -P ${pt_check})
add_test(NAME preload_glibc_version COMMAND ${CMAKE_COMMAND} -DMODE=glibc
  -DOBJDUMP=${CMAKE_OBJDUMP} -DLIB=$<TARGET_FILE:kvshim_preload> -DMAX=2.34 -P ${pt_check})
set_tests_properties(preload_exports preload_no_public_dlsym preload_glibc_version PROPERTIES
  TIMEOUT 60 LABELS "integration")
