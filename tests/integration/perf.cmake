# issue 15 (data plane and control plane) tests (included by tests/integration/CMakeLists.txt).
#   coord_rtt   a retrieve with one peer to ask is one PREPARE_RETRIEVE (no LOOKUP); with
#               several, LOOKUP each then retrieve the longest run
kvs_coordtest_criterion(coord_rtt)
#   coord_into  kvs_peers_retrieve_into: inline straight into the caller's buffers (one frame or
#               many), SHM, a buffer too small, the connection kept in step
kvs_coordtest_criterion(coord_into)
