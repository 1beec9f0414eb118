# tests/engines/server: kvshim's llama.cpp prefix cache in an unmodified llama-server (labels
# e2e and server: the sanitizer legs leave them out, as the other real-engine tests), one case
# per test, run serially (each starts 2-4 llama-server processes on the 8x512 tiny-gguf model):
# check_server.py's header lists the cases. The binaries come from scripts/llama-server-setup;
# when it cannot prepare them (exit 77) the tests are skipped. The model is written once into
# ${CMAKE_CURRENT_BINARY_DIR}/server (each case's work directory lies below it).
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  return()
endif()
kvshim_add_py_cases(server real ${CMAKE_CURRENT_LIST_DIR}/check_server.py LABELS e2e server
  TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL
  ARGS --preload $<TARGET_FILE:kvshim_preload> --cli $<TARGET_FILE:kvshim>
       --work-dir ${CMAKE_CURRENT_BINARY_DIR}/server/{case})

# The disk tier across a crash of serve (issue 26, design §18): disk_server.py's header says how.
kvshim_add_py_cases(server_disk real ${CMAKE_CURRENT_LIST_DIR}/disk_server.py LABELS e2e server
  TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL
  ARGS --preload $<TARGET_FILE:kvshim_preload> --cli $<TARGET_FILE:kvshim>
       --work-dir ${CMAKE_CURRENT_BINARY_DIR}/server/{case})
