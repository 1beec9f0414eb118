/* kvo_cold: a direct kvo ABI client (linked against libkvo_default.so, which caches nothing) for
 * the cold-start load path of shims/kvo: kvo_lookup only asks the peers, each kvo_load_chunk
 * copies from the peer the lookup found, and the local copy is kept behind the engine. Run by
 * kvo_cold_test.py with libkvshim.so preloaded, host buffers only.
 *
 * usage: kvo_cold hold | load-alive | load-gone
 *   hold        stores N_CHUNKS chunks of one sequence (kvshim keeps them), prints "stored",
 *               then waits for a line (or EOF) on stdin and exits
 *   load-alive  kvo_lookup (prints "looked R"), waits for a line on stdin, then loads every
 *               chunk: each must be KVO_OK and byte for byte what `hold` stored
 *   load-gone   the same, but the driver kills `hold` before sending the line: every load must
 *               fall back to the engine's module, whose answer (KVO_MISS) is returned
 * Prints "ok" and exits 0, or the first failed check and exits 1. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvshim/kvo.h>

#define N_CHUNKS 8u
#define TOKENS_PER_CHUNK 4u

static int failed(const char *what, long got) {
  fprintf(stderr, "kvo_cold: %s (got %ld)\n", what, got);
  return 1;
}

/* The expected bytes of chunk `chunk`: a byte pattern no other chunk shares. */
static void pattern(unsigned char *buf, size_t len, size_t chunk) {
  for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(chunk * 37u + i * 11u + 5u);
}

static void wait_line(void) {
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: kvo_cold hold|load-alive|load-gone\n");
    return 2;
  }
  kvo_desc_t d = {.abi_version = KVO_ABI_VERSION, .size = sizeof(kvo_desc_t),
                  .model_id = "kvo-cold", .dtype = KVO_DTYPE_F32, .layers = 2, .kv_heads = 2,
                  .head_dim = 16, .chunk_tokens = TOKENS_PER_CHUNK, .world_size = 1,
                  .layout = KVO_LAYOUT_LKTHD};
  d.chunk_bytes = kvo_desc_chunk_bytes(&d);
  uint32_t tokens[N_CHUNKS * TOKENS_PER_CHUNK];
  for (uint32_t i = 0; i < N_CHUNKS * TOKENS_PER_CHUNK; i++) tokens[i] = 500 + 3 * i;
  const size_t n = N_CHUNKS * TOKENS_PER_CHUNK, len = (size_t)d.chunk_bytes;
  unsigned char *want = malloc(len), *got = malloc(len);
  if (!want || !got) return failed("out of memory", 0);

  if (strcmp(argv[1], "hold") == 0) {
    for (size_t c = 0; c < N_CHUNKS; c++) {
      pattern(want, len, c);
      int rc = kvo_store_chunk(&d, tokens, n, c, KVO_BUF_HOST, (uint64_t)(uintptr_t)want, len);
      if (rc != KVO_OK) return failed("store not kept", rc);
    }
    printf("stored\n");
    fflush(stdout);
    wait_line();
  } else if (strcmp(argv[1], "load-alive") == 0 || strcmp(argv[1], "load-gone") == 0) {
    int alive = strcmp(argv[1], "load-alive") == 0;
    int run = kvo_lookup(&d, tokens, n);
    printf("looked %d\n", run);
    fflush(stdout);
    if (run != (int)N_CHUNKS) return failed("lookup did not find the holder's chunks", run);
    wait_line();
    for (size_t c = 0; c < N_CHUNKS; c++) {
      memset(got, 0, len);
      int rc = kvo_load_chunk(&d, tokens, n, c, KVO_BUF_HOST, (uint64_t)(uintptr_t)got, len);
      if (alive) {
        pattern(want, len, c);
        if (rc != KVO_OK) return failed("load from the live holder", rc);
        if (memcmp(want, got, len) != 0) return failed("loaded bytes differ, chunk", (long)c);
      } else if (rc != KVO_MISS) {
        return failed("load with the holder gone: not the module's KVO_MISS", rc);
      }
    }
  } else {
    return failed("unknown mode", 0);
  }
  free(want);
  free(got);
  printf("ok\n");
  return 0;
}
