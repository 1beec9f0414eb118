# tests/engines/llama/prefix.cmake: the transparent prefix cache (design §10.3) in unmodified
# node-llama-cpp 3.21.1 engines (the CLI `npx node-llama-cpp complete` and prefix_app.mjs), one
# case per test, llamaprefix_node_<case> (check_prefix.py's header):
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
kvshim_add_py_cases(llamaprefix node ${CMAKE_CURRENT_LIST_DIR}/check_prefix.py
  LABELS e2e TIMEOUT 900 SKIP_RETURN_CODE 77 RUN_SERIAL ASAN_RUNTIME
  ARGS --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
       --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-prefix-{case})
