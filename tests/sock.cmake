# core/wire/sock unit test (included by tests/CMakeLists.txt).
kvs_unit_test(test_sock)
