# tests/engines/llama/latest.cmake: llamalatest_node_<case> (e2e), the core prefix cache and state
# adapter scenarios on node-llama-cpp's latest release (3.22.1, llama.cpp v0.5.0; the npm
# workspace latest/, installed by scripts/llama-setup's npm ci beside the pinned 3.21.1):
#   prefix_cli   check_prefix.py cli on the latest CLI
#   prefix_app   check_prefix.py app (three sequences of one context)
#   state_peer   check_kvshim.py peer (app.mjs, the state adapter through the peer protocol)
# check_latest.py's header has the details. Same skip rule as llama_node_* (exit 77 without
# Node.js >= 20 or the npm registry). Included from tests/engines/CMakeLists.txt.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  return()
endif()
kvshim_add_py_cases(llamalatest node ${CMAKE_CURRENT_LIST_DIR}/check_latest.py
  LABELS e2e TIMEOUT 900 SKIP_RETURN_CODE 77 RUN_SERIAL ASAN_RUNTIME
  ARGS --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
       --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-latest-{case})
