/* core/memory/keys: known answers, determinism across processes, namespace sensitivity, partial chunks.
 *
 * The known-answer vectors were computed independently of keys.c, by a Python script that
 * builds the version-1 namespace record byte by byte (see keys.c) and hashes it with
 * python3-xxhash's xxh3_128. They pin the key scheme: a change to keys.c that alters any key
 * must fail here. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keys.h"

static kvs_namespace_t ns_a(void) {
  kvs_namespace_t ns;
  memset(&ns, 0, sizeof ns);
  strcpy(ns.engine, "kvo");
  memcpy(ns.model, "model-A", 7);
  ns.model_len = 7;
  ns.dtype = 1;
  ns.layers = 8;
  ns.kv_heads = 4;
  ns.head_dim = 64;
  ns.chunk_tokens = 4;
  ns.rank = 0;
  ns.world_size = 1;
  return ns;
}

/* h(-1) of ns_a(). */
static kvs_key_t h_a(void) {
  kvs_namespace_t ns = ns_a();
  return kvs_keys_namespace(&ns);
}

static void tokens_from(uint32_t *t, size_t n, uint32_t first) {
  for (size_t i = 0; i < n; i++) t[i] = first + (uint32_t)i;
}

static void expect_hex(kvs_key_t k, const char *hex) {
  char buf[KVS_KEY_HEX_LEN + 1];
  kvs_key_format(k, buf);
  cr_expect_str_eq(buf, hex);
}

Test(keys, known_answer_namespace_and_chunks) {
  kvs_key_t h = h_a();
  expect_hex(h, "7f72ac336a4b66c52dc428221ceb845a");
  uint32_t t[12];
  tokens_from(t, 12, 1000);
  kvs_key_t out[8];
  cr_assert_eq(kvs_keys_chunks(h, t, 12, 4, out, 8), 3);
  expect_hex(out[0], "dcce2ed39c387b575072378d2a2a77dc");
  expect_hex(out[1], "3b683456b83bee0d75e0d733e23e0519");
  expect_hex(out[2], "df33215482b6af5fbda8ade80207d25c");
  expect_hex(kvs_keys_name(h, "/tmp/state.bin", 14), "8329ab3eb068e1110476cdef33fa6138");
}

Test(keys, chain_is_rolling) {
  kvs_key_t h = h_a();
  uint32_t t[12];
  tokens_from(t, 12, 7);
  kvs_key_t out[3];
  kvs_keys_chunks(h, t, 12, 4, out, 3);
  /* h(i) depends on every earlier chunk: h(1) from chain(h(0), chunk 1). */
  cr_expect(kvs_key_eq(out[1], kvs_keys_chain(out[0], t + 4, 4)));
  cr_expect(kvs_key_eq(out[2], kvs_keys_chain(out[1], t + 8, 4)));
  /* Change a token of chunk 0: every key changes. */
  t[0]++;
  kvs_key_t alt[3];
  kvs_keys_chunks(h, t, 12, 4, alt, 3);
  for (int i = 0; i < 3; i++) cr_expect_not(kvs_key_eq(out[i], alt[i]), "key %d unchanged", i);
  /* Change a token of chunk 2 only: keys 0 and 1 stay. */
  t[0]--;
  t[11]++;
  kvs_keys_chunks(h, t, 12, 4, alt, 3);
  cr_expect(kvs_key_eq(out[0], alt[0]));
  cr_expect(kvs_key_eq(out[1], alt[1]));
  cr_expect_not(kvs_key_eq(out[2], alt[2]));
}

Test(keys, partial_chunks_produce_no_key) {
  kvs_key_t h = h_a();
  uint32_t t[11];
  tokens_from(t, 11, 0);
  kvs_key_t out[4] = {{0, 0}};
  cr_expect_eq(kvs_keys_chunks(h, t, 11, 4, out, 4), 2);
  cr_expect(kvs_key_is_zero(out[2]), "no key written past the full chunks");
  cr_expect_eq(kvs_keys_chunks(h, t, 3, 4, out, 4), 0);
  cr_expect_eq(kvs_keys_chunks(h, t, 11, 0, out, 4), 0, "chunk size 0 keys nothing");
  cr_expect_eq(kvs_keys_chunks(h, t, 11, 4, out, 1), 1, "max_out bounds the count");
}

/* Each field of the namespace, changed alone, changes h(-1) and so every chunk key. */
Test(keys, every_namespace_field_matters) {
  kvs_namespace_t base = ns_a();
  kvs_key_t h0 = kvs_keys_namespace(&base);
  uint32_t t[8];
  tokens_from(t, 8, 5);
  kvs_key_t k0[2];
  kvs_keys_chunks(h0, t, 8, 4, k0, 2);
  for (int field = 0; field < 11; field++) {
    kvs_namespace_t ns = base;
    switch (field) {
      case 0: strcpy(ns.engine, "llama.cpp"); break;
      case 1: ns.model[6] = 'B'; break;
      case 2: ns.model_len = 6; break;
      case 3: ns.dtype = 2; break;
      case 4: ns.layers = 9; break;
      case 5: ns.kv_heads = 8; break;
      case 6: ns.head_dim = 128; break;
      case 7: ns.chunk_tokens = 8; break;
      case 8: ns.rank = 1; break;
      case 9: ns.world_size = 2; break;
      case 10: strcpy(ns.salt, "tenant-b"); break;
    }
    kvs_key_t h = kvs_keys_namespace(&ns);
    cr_expect_not(kvs_key_eq(h, h0), "field %d does not change h(-1)", field);
    kvs_key_t k[2];
    kvs_keys_chunks(h, t, 8, 4, k, 2);
    for (int i = 0; i < 2; i++)
      cr_expect_not(kvs_key_eq(k[i], k0[i]), "field %d leaves chunk key %d unchanged", field, i);
  }
}

/* Two processes (the child re-executes nothing shared but the code) compute identical keys. */
Test(keys, deterministic_across_processes) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  uint32_t t[4096];
  tokens_from(t, 4096, 31337);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    kvs_key_t k[16];
    size_t n = kvs_keys_chunks(h_a(), t, 4096, 256, k, 16);
    ssize_t w = write(fds[1], k, n * sizeof k[0]);
    _exit(w == (ssize_t)(n * sizeof k[0]) ? 0 : 1);
  }
  close(fds[1]);
  kvs_key_t theirs[16];
  size_t got = 0;
  ssize_t r;
  while ((r = read(fds[0], (char *)theirs + got, sizeof theirs - got)) > 0) got += (size_t)r;
  close(fds[0]);
  int status;
  waitpid(pid, &status, 0);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cr_assert_eq(got, sizeof theirs);
  kvs_key_t mine[16];
  cr_assert_eq(kvs_keys_chunks(h_a(), t, 4096, 256, mine, 16), 16);
  cr_expect_arr_eq(mine, theirs, sizeof mine);
}

Test(keys, names_are_namespaced) {
  kvs_namespace_t a = ns_a(), b = ns_a();
  strcpy(b.salt, "x");
  kvs_key_t ha = kvs_keys_namespace(&a), hb = kvs_keys_namespace(&b);
  cr_expect_not(kvs_key_eq(kvs_keys_name(ha, "f", 1), kvs_keys_name(hb, "f", 1)));
  cr_expect_not(kvs_key_eq(kvs_keys_name(ha, "f", 1), kvs_keys_name(ha, "g", 1)));
  cr_expect(kvs_key_eq(kvs_keys_name(ha, "f", 1), kvs_keys_name(ha, "f", 1)));
}

Test(keys, hex_round_trip_and_bad_input) {
  kvs_key_t k = {0x0123456789abcdefull, 0xfedcba9876543210ull}, back;
  char buf[KVS_KEY_HEX_LEN + 1];
  kvs_key_format(k, buf);
  cr_expect_str_eq(buf, "fedcba98765432100123456789abcdef");
  cr_assert_eq(kvs_key_parse(buf, &back), 0);
  cr_expect(kvs_key_eq(k, back));
  kvs_key_t untouched = {1, 2};
  cr_expect_eq(kvs_key_parse("xyz", &untouched), -EINVAL);
  cr_expect_eq(kvs_key_parse("fedcba98765432100123456789abcdef0", &untouched), -EINVAL,
               "trailing digit");
  cr_expect_eq(kvs_key_parse("fedcba98765432100123456789abcdeg", &untouched), -EINVAL);
  cr_expect(untouched.lo == 1 && untouched.hi == 2, "out-parameter untouched on error");
}

Test(keys, long_salts_keep_every_byte) {
  char a[200], b[200];
  memset(a, 's', sizeof a - 1);
  a[sizeof a - 1] = '\0';
  memcpy(b, a, sizeof a);
  b[150] = 't'; /* differs only past the 64-byte field */
  kvs_namespace_t na = ns_a(), nb = ns_a(), nshort = ns_a();
  kvs_namespace_set_salt(&na, a);
  kvs_namespace_set_salt(&nb, b);
  cr_expect_eq(na.salt[0], '#');
  cr_expect_not(kvs_key_eq(kvs_keys_namespace(&na), kvs_keys_namespace(&nb)),
                "salts differing after byte 64 must give different namespaces");
  kvs_namespace_set_salt(&nshort, "tenant-a");
  cr_expect_str_eq(nshort.salt, "tenant-a");
}
