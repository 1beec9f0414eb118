# A large core/memory/store (prefetching) against a model of its LRU order
# (unit/test_store_large.c; included by tests/CMakeLists.txt).
kvs_unit_test(test_store_large)
