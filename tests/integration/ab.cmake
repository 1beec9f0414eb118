# A/B runner (scripts/ab) smoke tests: a tiny refengine workload in the arms off, loaded and on,
# a failing command, bad arguments. They check what the runner prints and writes, never the
# timings. Tests ab_fake_<case> (the cases: `ab_smoke.py --list`). Included from
# tests/integration/CMakeLists.txt.
#
# The loaded and on arms preload build/preload/libkvshim.so; when that file is not built, the
# tests run the off arm only and say so.
if(TARGET refengine)
  # scripts/ab installs python3-matplotlib when it is missing (root): allow for apt-get.
  kvshim_add_py_cases(ab fake ${CMAKE_CURRENT_SOURCE_DIR}/ab_smoke.py
    LABELS integration TIMEOUT 600 FAKECUDA
    ARGS --ab ${PROJECT_SOURCE_DIR}/scripts/ab --engine $<TARGET_FILE:refengine>
         --preload ${PROJECT_BINARY_DIR}/preload/libkvshim.so)
else()
  message(STATUS "kvshim: ab smoke tests skipped: no refengine target")
endif()
