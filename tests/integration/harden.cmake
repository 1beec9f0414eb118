# hardening tests (issue 17; included by tests/integration/CMakeLists.txt).
#   coord_harden    fd exhaustion in the accept loop, protocol corners, live-pins gauge, pool mode
kvs_coordtest_criterion(coord_harden)

# soak_client: the engine-like peer scripts/soak runs 8 of (stores, lookups, retrieves, every
# retrieved byte checked). Not a ctest test: scripts/soak is its driver.
add_executable(soak_client ${kvs_coordtest_dir}/soak_client.c)
target_link_libraries(soak_client PRIVATE kvs_coord_client kvshim_core kvshim_flags Threads::Threads)

# harden_llama.py: the prefix cache under faults in the cache peer (fakellama prefixhost):
# harden_fake_<case>.
if(TARGET kvshim_preload AND TARGET fakellama_prefixhost AND TARGET kvshim)
  kvshim_add_py_cases(harden fake ${kvs_coordtest_dir}/harden_llama.py
    LABELS integration TIMEOUT 300 ASAN_RUNTIME ENVIRONMENT ${KVSHIM_TEST_LSAN}
    ARGS --host $<TARGET_FILE:fakellama_prefixhost> --preload $<TARGET_FILE:kvshim_preload>
         --cli $<TARGET_FILE:kvshim>)
endif()
# harden_prefix.py (the same faults on the node-llama-cpp CLI) is registered in
# tests/engines/llama/llama.cmake: harden_node_<case>.
