# hardening tests (issue 17; included by tests/integration/CMakeLists.txt).
#   coord_harden    fd exhaustion in the accept loop, protocol corners, live-pins gauge, pool mode
kvs_coordtest_criterion(coord_harden)
