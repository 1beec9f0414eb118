# kvs_peers_fetch tests (included by tests/integration/CMakeLists.txt, after coord.cmake).
#   coord_fetch           a peer's objects into local reservations: chunks (SHM and inline),
#                         a wrong size, a blob bound under keys read from its bytes, no store
kvs_coordtest_criterion(coord_fetch)
