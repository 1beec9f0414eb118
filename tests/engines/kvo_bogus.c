/* libkvo_bogus: a test-only kvo module that refengine never links. Preloaded with LD_PRELOAD,
 * it takes the place of libkvo_default's functions exactly as kvshim will, which shows that
 * all three calls are reachable by interposition. It serves wrong bytes on purpose:
 *   kvo_lookup      every full chunk is "cached" (none when KVO_BOGUS_LOOKUP=0)
 *   kvo_load_chunk  fills the buffer with 0xA5 bytes (so --verify must fail)
 *   kvo_store_chunk claims every chunk was kept (libkvo_default without a cache never does) */
#include <cuda.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <kvshim/kvo.h>

KVO_API int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  int rc = kvo_desc_check(desc);
  if (rc != 0) return rc;
  const char *env = getenv("KVO_BOGUS_LOOKUP");
  bool none = env != NULL && strcmp(env, "0") == 0;
  return none ? 0 : (int)(n_tokens / desc->chunk_tokens);
}

KVO_API int kvo_load_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                           size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  int rc = kvo_desc_check(desc);
  if (rc != 0) return rc;
  if (buf_len < desc->chunk_bytes) return -ENOBUFS;
  size_t len = (size_t)desc->chunk_bytes;
  if (buf_kind == KVO_BUF_HOST) {
    memset((void *)(uintptr_t)buf, 0xA5, len);
    return KVO_OK;
  }
  void *junk = malloc(len);
  if (junk == NULL) return -ENOMEM;
  memset(junk, 0xA5, len);
  rc = cuMemcpyHtoD((CUdeviceptr)buf, junk, len) == CUDA_SUCCESS ? KVO_OK : -EIO;
  free(junk);
  return rc;
}

KVO_API int kvo_store_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                            size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  int rc = kvo_desc_check(desc);
  return rc != 0 ? rc : KVO_OK;
}
