# tests/integration/docs_contract.cmake: README.md and docs/protocol.md against the lists they
# document (options, stats, opcodes/errors/caps, CLI commands), through the kvshim binary, and
# every "design §N" of the tree against docs/design.md's sections.
# docs_fake_<case> (the cases: `docs_contract.py --list`).
kvshim_add_py_cases(docs fake ${CMAKE_CURRENT_SOURCE_DIR}/docs_contract.py
  LABELS integration TIMEOUT 120 ARGS --cli $<TARGET_FILE:kvshim> --source ${PROJECT_SOURCE_DIR})
