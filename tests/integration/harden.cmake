# hardening tests (issue 17; included by tests/integration/CMakeLists.txt).
#   coord_harden    fd exhaustion in the accept loop, protocol corners, live-pins gauge, pool mode
kvs_coordtest_criterion(coord_harden)

# soak_client: the engine-like peer scripts/soak runs 8 of (stores, lookups, retrieves, every
# retrieved byte checked). Not a ctest test: scripts/soak is its driver.
add_executable(soak_client ${kvs_coordtest_dir}/soak_client.c)
target_link_libraries(soak_client PRIVATE kvs_coord_client kvshim_core kvshim_flags Threads::Threads)
