# A/B runner (scripts/ab) smoke tests: a tiny refengine workload in the arms off, loaded and on,
# a failing command, bad arguments. They check what the runner prints and writes, never the
# timings. Included from tests/integration/CMakeLists.txt.
#
# The loaded and on arms preload KVSHIM_AB_PRELOAD; when that file is not built, the tests run
# the off arm only and say so.
if(TARGET refengine)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  set(KVSHIM_AB_PRELOAD "${PROJECT_BINARY_DIR}/preload/libkvshim.so")
  foreach(case run fail usage)
    add_test(NAME ab_smoke_${case}
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ab_smoke.py ${case}
              ${PROJECT_SOURCE_DIR}/scripts/ab $<TARGET_FILE:refengine> ${KVSHIM_AB_PRELOAD})
    # scripts/ab installs python3-matplotlib when it is missing (root): allow for apt-get.
    set_tests_properties(ab_smoke_${case} PROPERTIES TIMEOUT 600 LABELS "integration")
    kvs_fakecuda_env(ab_smoke_${case})
  endforeach()
else()
  message(STATUS "kvshim: ab smoke tests skipped: no refengine target")
endif()
