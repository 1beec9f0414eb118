# The lean engine pool (issue 13): limit and step-ahead prefault (unit/test_pool_lean.c).
kvs_unit_test(test_pool_lean)
