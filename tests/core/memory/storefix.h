/* Fixture pieces shared by the store unit tests (test_store.c, test_store_large.c). */
#ifndef KVSHIM_TEST_STOREFIX_H
#define KVSHIM_TEST_STOREFIX_H

#include <criterion/criterion.h>

#include "pool.h"
#include "store.h"

/* End a test: the store must still be valid; destroying it (leases ended by force) must leave
 * no extent in its pool. Both pointers come back NULL. */
static inline void storefix_close(kvs_store_t **st, kvs_pool_t **pool) {
  if (*st) {
    cr_assert(kvs__store_is_valid(*st), "store invariants broken");
    cr_assert_eq(kvs_store_destroy(*st, true), 0);
  }
  *st = NULL;
  if (*pool) cr_assert_eq(kvs_pool_destroy(*pool, false), 0, "store left extents behind");
  *pool = NULL;
}

#endif
