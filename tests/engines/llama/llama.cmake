# tests/engines/llama: the node-llama-cpp test engine (app.mjs) and the tiny-gguf model generator.
# Included from tests/engines/CMakeLists.txt. Nothing here is built; the tests run Python 3.
#
# llama_py_tiny_gguf (unit): scripts/tiny-gguf's output read back by an independent GGUF reader.
# llama_node_baseline (e2e): app.mjs with node-llama-cpp 3.21.1, no kvshim: loaded prefix states
#   reproduce the reference tokens exactly, and another prefix's state changes them. It runs
#   scripts/llama-setup first (npm ci when node_modules is not current), so it may need the npm
#   registry once; without Node.js >= 20 or the registry it exits 77 and ctest reports it skipped.
set(kvshim_llama_dir ${CMAKE_CURRENT_LIST_DIR})

kvshim_add_py_cases(llama py ${kvshim_llama_dir}/check_tiny_gguf.py LABELS unit TIMEOUT 120
  ARGS --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-tiny-gguf)
kvshim_add_py_cases(llama node ${kvshim_llama_dir}/check_baseline.py LABELS e2e TIMEOUT 1200
  SKIP_RETURN_CODE 77 RUN_SERIAL ARGS --work-dir ${CMAKE_CURRENT_BINARY_DIR}/llama-baseline)

# llama_node_<case> (e2e): app.mjs under LD_PRELOAD=libkvshim.so (set only in the engines'
# environment, a temporary KVSHIM_RUN_DIR per test), one case per test (check_kvshim.py's header):
#   peer       B restores A's saved prefix through the peer protocol while A is alive
#   serve      A pushes to `kvshim serve` and exits; B restores from the serve peer
#   negative   another prefix's state under B's expected name changes B's tokens (it is used)
#   isolation  a second model of the same shape never gets the first model's state
#   fault      A stopped, then killed while B waits for it: B falls back with the right tokens
#   inspect    `kvshim inspect --json` on node-llama-cpp's addon: llama hooks interposable
# Same skip rule as llama_node_baseline (exit 77 without Node.js >= 20 or the npm registry).
if(NOT TARGET kvshim_preload OR NOT TARGET kvshim)
  message(STATUS "kvshim: llama e2e tests with kvshim skipped: libkvshim.so or the CLI not built")
  return()
endif()
# llamaprefix_node_<case> (e2e): the transparent prefix cache (design §10.3) in unmodified
# node-llama-cpp 3.21.1 engines (the CLI `npx node-llama-cpp complete` and prefix_app.mjs), one
# case per test (check_prefix.py's header):
#   cli         CLI A, then CLI B in a new process sharing a long prefix, `kvshim serve` the cache
#               peer: B's completion == B without kvshim, restored tokens in B's stats
#   app         three sequences of one context, prompts sharing the prefix (one batch; 512)
#   divergence  part of a chunk, context shift, an output on every token, mixed batches
#   sequences   two sequences of one context evaluated at once restore a cached prefix
#   four        four processes started together compute a shared prefix once (single flight)
#   swa         a sliding-window model without swa_full (tiny_swa.py): whole states only, identical
#   faults      another model, another KV type, a full pool, the cache peer stopped and killed
#   disabled    KVSHIM_ENABLE=0 and KVSHIM_LLAMA_PREFIX=0
#   chunks      KVSHIM_LLAMA_CHUNKS=1: shared chunks stored once, restores by assembly, identical
#   inspect     `kvshim inspect --json` on libllama: the sampler's llama_get_logits_ith is a PLT call
# and harden_prefix.py's faults in the cache peer (a corrupt state in serve's pool, a full serve,
# serve SIGKILLed while B restores: issue 17): harden_node_<case>; and check_onecopy.py's one copy
# per node with `kvshim serve` in the group (issue 13): llamacopy_node_<case>.
# Each row: area, driver, timeout (s), work directory.
foreach(row "llama:check_kvshim:600:llama-kvshim" "llamaprefix:check_prefix:900:llama-prefix"
        "harden:harden_prefix:900:harden-prefix"
        "llamacopy:check_onecopy:600:llama-onecopy")
  string(REPLACE ":" ";" row "${row}")
  list(GET row 0 area)
  list(GET row 1 driver)
  list(GET row 2 timeout)
  list(GET row 3 workdir)
  kvshim_add_py_cases(${area} node ${kvshim_llama_dir}/${driver}.py
    LABELS e2e TIMEOUT ${timeout} SKIP_RETURN_CODE 77 RUN_SERIAL ASAN_RUNTIME
    ARGS --preload $<TARGET_FILE:kvshim_preload> --kvshim $<TARGET_FILE:kvshim>
         --work-dir ${CMAKE_CURRENT_BINARY_DIR}/${workdir}-{case})
endforeach()
