# tests/engines/llama/prefix.cmake: the transparent prefix cache (design §10.3) in unmodified
# node-llama-cpp 3.21.1 engines (the CLI `npx node-llama-cpp complete` and prefix_app.mjs), one
# case per test (check_prefix.py's header):
#   cli         CLI A, then CLI B in a new process sharing a long prefix, `kvshim serve` the cache
#               peer: B's completion == B without kvshim, restored tokens in B's stats
#   app         three sequences of one context, prompts sharing the prefix (one batch; 512)
#   divergence  part of a chunk, context shift, an output on every token, mixed batches
#   faults      another model, another KV type, a full pool, the cache peer stopped and killed
#   disabled    KVSHIM_ENABLE=0 and KVSHIM_LLAMA_PREFIX=0
#   inspect     `kvshim inspect --json` on libllama: the sampler's llama_get_logits_ith is a PLT call
# Included from llama.cmake. Label e2e; exit 77 (skipped) without Node.js >= 20 or the npm registry.
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(llama_prefix_e2e_extra "")
if(KVSHIM_SANITIZE MATCHES "address")
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE llama_prefix_e2e_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${llama_prefix_e2e_asan}" AND EXISTS "${llama_prefix_e2e_asan}")
    set(llama_prefix_e2e_extra --asan-runtime ${llama_prefix_e2e_asan})
  endif()
endif()
foreach(case IN ITEMS cli app divergence faults disabled inspect)
  add_test(NAME llama_prefix_e2e_${case}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_prefix.py --case ${case}
            --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
            --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-prefix-${case} ${llama_prefix_e2e_extra})
  set_tests_properties(llama_prefix_e2e_${case} PROPERTIES TIMEOUT 900 LABELS "e2e"
    SKIP_RETURN_CODE 77 RUN_SERIAL ON)
endforeach()
