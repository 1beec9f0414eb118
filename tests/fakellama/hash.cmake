# test_llama_hash: the blob checksum's AVX2 hash and its dispatch (shims/llama/blob_hash.c,
# blob.c) give the portable XXH3 value. Included from tests/fakellama/CMakeLists.txt.
add_executable(test_llama_hash test_llama_hash.c ${PROJECT_SOURCE_DIR}/shims/llama/blob.c
  ${PROJECT_SOURCE_DIR}/shims/llama/blob_hash.c)
target_include_directories(test_llama_hash PRIVATE ${PROJECT_SOURCE_DIR}/shims/llama
  ${PROJECT_SOURCE_DIR}/runtime ${kvshim_core_include_dirs})
target_link_libraries(test_llama_hash PRIVATE kvshim_flags kvshim_core PkgConfig::XXHASH
  PkgConfig::CRITERION Threads::Threads)
add_test(NAME test_llama_hash COMMAND test_llama_hash --jobs 2)
set_tests_properties(test_llama_hash PROPERTIES TIMEOUT 120 LABELS "unit"
  ENVIRONMENT "${KVSHIM_TEST_LSAN}")
