/* The remote tier's value format (core/tiers/remote.h): a value checks only when every header field
 * agrees with the key it is stored under and with its payload; any other byte string is refused
 * (the tier then misses, deletes and counts it). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"

#define T(name) Test(remote_value, name, .timeout = 30)

static const kvs_key_t KEY = {0x1122334455667788ull, 0x99aabbccddeeff00ull};

/* An object value: header + payload of a 2 x 3 F32 layout (24 bytes). */
static uint8_t *object(size_t *len) {
  kvs_layout_t l = {KVS_DTYPE_F32, 2, {2, 3}};
  uint8_t payload[24];
  for (int i = 0; i < 24; i++) payload[i] = (uint8_t)(i * 7 + 1);
  uint8_t *v = malloc(KVS_REMOTE_HDR_SIZE + 24);
  kvs_remote_header(v, KEY, KVS_REMOTE_KIND_OBJECT, &l, payload, 24, 42, 1700000000000ull);
  memcpy(v + KVS_REMOTE_HDR_SIZE, payload, 24);
  *len = KVS_REMOTE_HDR_SIZE + 24;
  return v;
}

/* kvs_remote_check where only its verdict matters (0 or -EBADMSG). */
static int verdict(const uint8_t *v, size_t len, kvs_key_t key) {
  unsigned kind;
  kvs_layout_t l;
  const uint8_t *p;
  uint64_t plen;
  return kvs_remote_check(v, len, key, &kind, &l, &p, &plen);
}

T(key_name_is_prefix_and_32_hex_digits) {
  char name[KVS_REMOTE_KEY_LEN + 1];
  kvs_remote_key_name(KEY, name);
  cr_assert_str_eq(name, "kvshim:v1:99aabbccddeeff001122334455667788");
  cr_assert_eq(strlen(name), KVS_REMOTE_KEY_LEN);
}

T(object_round_trips) {
  size_t len;
  uint8_t *v = object(&len);
  unsigned kind = 9;
  kvs_layout_t l;
  const uint8_t *p = NULL;
  uint64_t plen = 0;
  cr_assert_eq(kvs_remote_check(v, len, KEY, &kind, &l, &p, &plen), 0);
  cr_assert_eq(kind, KVS_REMOTE_KIND_OBJECT);
  cr_assert_eq(l.dtype, KVS_DTYPE_F32);
  cr_assert_eq(l.ndim, 2);
  cr_assert_eq(l.shape[0], 2);
  cr_assert_eq(l.shape[1], 3);
  cr_assert_eq(plen, 24);
  cr_assert_eq(p, v + KVS_REMOTE_HDR_SIZE);
  /* fixed fields at their pinned offsets, little-endian */
  uint32_t magic;
  memcpy(&magic, v, 4);
  cr_assert_eq(magic, KVS_REMOTE_MAGIC);
  cr_assert_eq(memcmp(v, "KVSR", 4), 0);
  uint64_t producer, created;
  memcpy(&producer, v + 40, 8);
  memcpy(&created, v + 48, 8);
  cr_assert_eq(producer, 42);
  cr_assert_eq(created, 1700000000000ull);
  free(v);
}

T(every_byte_flip_is_refused) {
  size_t len;
  uint8_t *v = object(&len);
  /* Producer (40..47) and created (48..55) are informational; every other byte is checked. */
  for (size_t i = 0; i < len; i++) {
    if (i >= 40 && i < 56) continue;
    v[i] ^= 0x01;
    cr_assert_eq(verdict(v, len, KEY), -EBADMSG, "byte %zu flipped was accepted", i);
    v[i] ^= 0x01;
  }
  cr_assert_eq(verdict(v, len, KEY), 0);
  free(v);
}

T(truncated_extended_or_misfiled_values_are_refused) {
  size_t len;
  uint8_t *v = object(&len);
  for (size_t n = 0; n < len; n++)
    cr_assert_eq(verdict(v, n, KEY), -EBADMSG, "len %zu", n);
  uint8_t *big = calloc(1, len + 1);
  memcpy(big, v, len);
  cr_assert_eq(verdict(big, len + 1, KEY), -EBADMSG);
  kvs_key_t other = {KEY.lo, KEY.hi ^ 1};
  cr_assert_eq(verdict(v, len, other), -EBADMSG, "a value stored under another key");
  cr_assert_eq(verdict(NULL, 0, KEY), -EBADMSG);
  free(big);
  free(v);
}

T(alias_names_its_primary) {
  kvs_key_t prim = {7, 8};
  uint8_t v[KVS_REMOTE_HDR_SIZE + 16], pk[16];
  memcpy(pk, &prim.lo, 8);
  memcpy(pk + 8, &prim.hi, 8);
  kvs_remote_header(v, KEY, KVS_REMOTE_KIND_ALIAS, NULL, pk, 16, 1, 2);
  memcpy(v + KVS_REMOTE_HDR_SIZE, pk, 16);
  unsigned kind;
  kvs_layout_t l;
  const uint8_t *p;
  uint64_t plen;
  cr_assert_eq(kvs_remote_check(v, sizeof v, KEY, &kind, &l, &p, &plen), 0);
  cr_assert_eq(kind, KVS_REMOTE_KIND_ALIAS);
  cr_assert_eq(plen, 16);
  cr_assert_eq(memcmp(p, pk, 16), 0);
  /* an alias with a layout, or with a payload that is not one key, is refused */
  uint8_t bad[KVS_REMOTE_HDR_SIZE + 17];
  kvs_remote_header(bad, KEY, KVS_REMOTE_KIND_ALIAS, NULL, pk, 16, 1, 2);
  bad[60] = 1; /* ndim 1 */
  memcpy(bad + KVS_REMOTE_HDR_SIZE, pk, 16);
  cr_assert_eq(verdict(bad, KVS_REMOTE_HDR_SIZE + 16, KEY), -EBADMSG);
  uint8_t p17[17] = {0};
  kvs_remote_header(bad, KEY, KVS_REMOTE_KIND_ALIAS, NULL, p17, 17, 1, 2);
  memcpy(bad + KVS_REMOTE_HDR_SIZE, p17, 17);
  cr_assert_eq(verdict(bad, sizeof bad, KEY), -EBADMSG);
}

T(layout_must_match_the_payload) {
  kvs_layout_t l = {KVS_DTYPE_F32, 1, {5}}; /* 20 bytes, payload 24 */
  uint8_t v[KVS_REMOTE_HDR_SIZE + 24] = {0};
  kvs_remote_header(v, KEY, KVS_REMOTE_KIND_OBJECT, &l, v + KVS_REMOTE_HDR_SIZE, 24, 1, 2);
  cr_assert_eq(verdict(v, sizeof v, KEY), -EBADMSG);
}
