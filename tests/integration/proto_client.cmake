# tests/integration/proto_client.cmake: an independent wire-protocol client (Python stdlib,
# written from docs/protocol.md alone) against `kvshim serve`: HELLO with and without
# AUTO_RELEASE, the SHM store, the one-round-trip retrieve, auto-released pins, split messages,
# bad input.
# protoclient_fake_<case> (the cases: `proto_client.py --list`).
kvshim_add_py_cases(protoclient fake ${CMAKE_CURRENT_SOURCE_DIR}/proto_client.py
  LABELS integration TIMEOUT 120 ARGS --cli $<TARGET_FILE:kvshim>)
