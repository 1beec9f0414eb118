/* tests/fakes/llama: the fake GGUF model file libfakellama loads (fakellama.h): written by the
 * hosts' mkmodel command (hostutil.h) and by the unit tests that load a model themselves
 * (test_llama_chunks.c). One writer, static inline: each includer uses what it needs. */
#ifndef KVSHIM_TESTS_FAKEGGUF_H
#define KVSHIM_TESTS_FAKEGGUF_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline void fakegguf_str(FILE *f, const char *s) {
  uint64_t n = strlen(s);
  fwrite(&n, 8, 1, f);
  fwrite(s, 1, n, f);
}
static inline void fakegguf_kv_str(FILE *f, const char *k, const char *v) {
  uint32_t t = 8; /* GGUF_TYPE_STRING */
  fakegguf_str(f, k);
  fwrite(&t, 4, 1, f);
  fakegguf_str(f, v);
}
static inline void fakegguf_kv_u32(FILE *f, const char *k, uint32_t v) {
  uint32_t t = 4; /* GGUF_TYPE_UINT32 */
  fakegguf_str(f, k);
  fwrite(&t, 4, 1, f);
  fwrite(&v, 4, 1, f);
}

/* A GGUF v3 of no tensors: architecture fakellama, n_layer layers of n_embd, swa > 0 a
 * sliding window of swa tokens (fakellama.attention.sliding_window, what llama_model_n_swa
 * reports), then weight_kb KiB of pseudo-random "weights" of seed (the model's identity:
 * kvshim fingerprints the file). */
static inline void fakegguf_write(FILE *f, const char *name, uint32_t n_layer, uint32_t n_embd,
                                  long weight_kb, uint64_t seed, uint32_t swa) {
  uint32_t magic = 0x46554747u, ver = 3;
  uint64_t n_tensors = 0, n_kv = swa ? 5 : 4;
  fwrite(&magic, 4, 1, f);
  fwrite(&ver, 4, 1, f);
  fwrite(&n_tensors, 8, 1, f);
  fwrite(&n_kv, 8, 1, f);
  fakegguf_kv_str(f, "general.architecture", "fakellama");
  fakegguf_kv_str(f, "general.name", name);
  fakegguf_kv_u32(f, "fakellama.block_count", n_layer);
  fakegguf_kv_u32(f, "fakellama.embedding_length", n_embd);
  if (swa) fakegguf_kv_u32(f, "fakellama.attention.sliding_window", swa);
  uint64_t x = seed * 0x2545f4914f6cdd1dull + 7;
  uint8_t blk[1024];
  for (long i = 0; i < weight_kb; i++) {
    for (size_t j = 0; j < sizeof blk; j++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      blk[j] = (uint8_t)(x >> 32);
    }
    fwrite(blk, 1, sizeof blk, f);
  }
}

#endif
