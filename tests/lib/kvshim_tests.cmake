# tests/lib/kvshim_tests.cmake: the helpers every test registration uses (style rule 16).
# Included once by tests/CMakeLists.txt before its subdirectories, so every folder's
# CMakeLists.txt can call them.
#
# kvshim_add_py_cases(<area> <engine> <driver.py>
#                     [ARGS arg...] [LABELS label...] [TIMEOUT seconds] [ENVIRONMENT VAR=value...]
#                     [ONLY case...] [EXCLUDE case...] [REQUIRES target...] [ASAN_RUNTIME]
#                     [FAKECUDA] [SKIP_RETURN_CODE code] [RUN_SERIAL])
#   Registers one ctest per case of a Python driver built on tests/lib/harness.py. The case list
#   is written once, in the driver: it is read at configure time from `<driver> --list` (and
#   editing the driver re-runs the configure step). Each test runs
#       python3 <driver> <case> ARGS... [--asan-runtime LIBASAN]
#   and is named <area>_<engine>_<case> ('-' in a case name becomes '_'): <engine> says what
#   runs, `fake` for the stand-ins (tests/fakes/cuda, tests/fakes/llama, refengine, fixtures) and
#   `node` for node-llama-cpp. `{case}` in ARGS becomes the case's name (per-case work dirs).
#     ONLY / EXCLUDE    register only these cases / all but these
#     REQUIRES          the targets ARGS names: when one is not built, register nothing and say
#                       so in one status line
#     ASAN_RUNTIME      in ASan builds, pass --asan-runtime with the shared sanitizer runtime
#                       (the driver preloads it before libkvshim.so)
#     FAKECUDA          select the fake CUDA driver through LD_LIBRARY_PATH (kvs_fakecuda_env)
#     TIMEOUT           default 300
#   Example (tests/shims/llama/CMakeLists.txt):
#     kvshim_add_py_cases(llama fake llama_shim.py LABELS integration TIMEOUT 180 ASAN_RUNTIME
#       ENVIRONMENT ${KVSHIM_TEST_LSAN}
#       ARGS --host $<TARGET_FILE:fakellama_host> --preload $<TARGET_FILE:kvshim_preload> ...)
#
# kvshim_asan_runtime(<var>)
#   Sets <var> to the shared ASan runtime (libasan.so) in builds with KVSHIM_SANITIZE=address
#   (a test that preloads an instrumented libkvshim.so into an uninstrumented program puts it
#   first in LD_PRELOAD), to "" otherwise. Warns once when such a build has none.
# kvshim_asan_runtime_arg(<var>)
#   Sets <var> to `--asan-runtime <libasan.so>` (what a Python driver takes) where
#   kvshim_asan_runtime finds one, to "" otherwise.
#
# kvs_unit_test(<name> [source...])
#   A Criterion unit test of core: <name>.c of the calling folder (and the extra sources) linked
#   with kvshim_core; the test runs `<name> --jobs 2`, label unit, TIMEOUT 300, KVSHIM_TEST_LSAN.
# kvs_program_test(<name> [arg...])
#   A plain program (no Criterion runner: the TSan leg runs it) from <name>.c of the calling
#   folder, run with the args; labels unit and stress, TIMEOUT 300.
#
# KVSHIM_TEST_LSAN
#   The LSAN_OPTIONS entry for a test's ENVIRONMENT (tests/lsan.supp: the test runner's known
#   leaks).
include_guard(GLOBAL)

get_filename_component(kvshim_tests_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(KVSHIM_TEST_LSAN
  "LSAN_OPTIONS=suppressions=${kvshim_tests_dir}/lsan.supp:print_suppressions=0")

function(kvshim_asan_runtime out)
  set(path "")
  if(KVSHIM_SANITIZE MATCHES "address")
    get_property(known GLOBAL PROPERTY KVSHIM_ASAN_RUNTIME SET)
    if(known)
      get_property(path GLOBAL PROPERTY KVSHIM_ASAN_RUNTIME)
    else()
      execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
        OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(NOT IS_ABSOLUTE "${path}" OR NOT EXISTS "${path}")
        message(WARNING "kvshim: no shared ASan runtime found (${path}): tests that preload "
                        "libkvshim.so may fail")
        set(path "")
      endif()
      set_property(GLOBAL PROPERTY KVSHIM_ASAN_RUNTIME "${path}")
    endif()
  endif()
  set(${out} "${path}" PARENT_SCOPE)
endfunction()

function(kvshim_asan_runtime_arg out)
  kvshim_asan_runtime(lib)
  set(arg "")
  if(lib)
    set(arg --asan-runtime ${lib})
  endif()
  set(${out} "${arg}" PARENT_SCOPE)
endfunction()

function(kvshim_add_py_cases area engine driver)
  cmake_parse_arguments(PARSE_ARGV 3 arg "ASAN_RUNTIME;FAKECUDA;RUN_SERIAL"
    "TIMEOUT;SKIP_RETURN_CODE" "ARGS;LABELS;ENVIRONMENT;ONLY;EXCLUDE;REQUIRES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kvshim_add_py_cases(${area} ${engine}): unknown arguments "
                        "${arg_UNPARSED_ARGUMENTS}")
  endif()
  set(missing "")
  foreach(t IN LISTS arg_REQUIRES)
    if(NOT TARGET ${t})
      list(APPEND missing ${t})
    endif()
  endforeach()
  if(missing)
    list(JOIN missing ", " missing)
    message(STATUS "kvshim: ${area}_${engine}_* tests skipped: ${missing} not built")
    return()
  endif()
  if(NOT Python3_EXECUTABLE)
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
  endif()
  get_filename_component(driver "${driver}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  execute_process(COMMAND ${Python3_EXECUTABLE} ${driver} --list
    OUTPUT_VARIABLE listed ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvshim: ${driver} --list failed (${rc}):\n${err}")
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${driver})
  string(REGEX MATCHALL "[^\n]+" cases "${listed}")
  foreach(c IN LISTS arg_ONLY arg_EXCLUDE)
    if(NOT c IN_LIST cases)
      message(FATAL_ERROR "kvshim_add_py_cases(${area} ${engine}): ${driver} has no case '${c}'")
    endif()
  endforeach()

  set(asan "")
  if(arg_ASAN_RUNTIME)
    kvshim_asan_runtime_arg(asan)
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()

  foreach(case IN LISTS cases)
    if((arg_ONLY AND NOT case IN_LIST arg_ONLY) OR case IN_LIST arg_EXCLUDE)
      continue()
    endif()
    string(REPLACE "-" "_" name "${area}_${engine}_${case}")
    string(REPLACE "{case}" "${case}" args "${arg_ARGS}")
    add_test(NAME ${name} COMMAND ${Python3_EXECUTABLE} ${driver} ${case} ${args} ${asan})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${arg_TIMEOUT} LABELS "${arg_LABELS}")
    if(arg_ENVIRONMENT)
      set_tests_properties(${name} PROPERTIES ENVIRONMENT "${arg_ENVIRONMENT}")
    endif()
    if(arg_SKIP_RETURN_CODE)
      set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${arg_SKIP_RETURN_CODE})
    endif()
    if(arg_RUN_SERIAL)
      set_tests_properties(${name} PROPERTIES RUN_SERIAL ON)
    endif()
    if(arg_FAKECUDA)
      kvs_fakecuda_env(${name}) # after ENVIRONMENT: older CMake appends to that property
    endif()
  endforeach()
endfunction()

function(kvs_unit_test name)
  add_executable(${name} ${name}.c ${ARGN})
  target_link_libraries(${name} PRIVATE kvshim_core kvshim_flags PkgConfig::CRITERION Threads::Threads)
  add_test(NAME ${name} COMMAND ${name} --jobs 2)
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "unit"
    ENVIRONMENT "${KVSHIM_TEST_LSAN}")
endfunction()

function(kvs_program_test name)
  add_executable(${name} ${name}.c)
  target_link_libraries(${name} PRIVATE kvshim_core kvshim_flags Threads::Threads)
  add_test(NAME ${name} COMMAND ${name} ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "unit;stress")
endfunction()
