# tests/engines/server: scripts/demo's llama-server part (server_ab.py) on the real llama-server
# built by scripts/llama-server-setup: server_demo_<case> (check_demo.py's header), labels e2e
# and server. Skipped (77) where llama-server cannot be built. Included from
# tests/engines/CMakeLists.txt.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  return()
endif()
kvshim_add_py_cases(server demo ${CMAKE_CURRENT_LIST_DIR}/check_demo.py
  LABELS e2e server TIMEOUT 900 SKIP_RETURN_CODE 77 RUN_SERIAL
  ARGS --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>)
