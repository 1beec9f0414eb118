/* tests/fakes/llama: a libggml-base stand-in, the two ggml entry points libfakellama calls.
 *
 * The pinned llama.cpp loads a sequence state's tensor data through ggml_backend_tensor_set
 * and writes it out (llama_state_seq_get_data, the state files) through
 * ggml_backend_tensor_get, calls from libllama.so into libggml-base.so through the PLT (both
 * are undefined dynamic symbols of libllama.so), so a library LD_PRELOADed into the engine can
 * interpose them. The fake keeps that shape: libfakeggml.so exports both and libfakellama.so
 * has it as a NEEDED library and calls them through its PLT (fakellama.c run_do).
 *
 * ggml_backend_tensor_set makes the checks the real one makes (ggml/src/ggml-backend.cpp:335-348
 * of the pinned release) and aborts as GGML_ASSERT does, with a message naming the failed
 * check: a NULL tensor, a tensor without a buffer, a size-0 write returns without writing, a
 * tensor without data, offset + size beyond the tensor's bytes (ggml_nbytes). Otherwise it
 * copies size bytes from data to the tensor's bytes at offset (a CPU buffer's set_tensor is
 * that memcpy). ggml_backend_tensor_get (ggml-backend.cpp:350-363) makes the same checks in the
 * same order (out of bounds: "tensor read out of bounds") and copies the tensor's bytes
 * [offset, offset + size) to data.
 *
 * struct ggml_tensor is the fake's own layout, not ggml's: kvshim never dereferences a tensor,
 * it passes the pointer through. */
#ifndef KVSHIM_FAKEGGML_H
#define KVSHIM_FAKEGGML_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKEGGML_API __attribute__((visibility("default")))

/* One host allocation that tensors' bytes lie in (fakeggml.c). */
struct ggml_backend_buffer;

/* A tensor: nbytes bytes at data, inside buffer. Invariant for a tensor of
 * fakeggml_tensor_new: buffer != NULL, data != NULL, nbytes > 0. */
struct ggml_tensor {
  struct ggml_backend_buffer *buffer; /* NULL: not allocated ("tensor buffer not set") */
  void *data;                         /* the tensor's first byte */
  size_t nbytes;                      /* ggml_nbytes: the bytes a write may reach */
  char name[48];                      /* for the abort message */
};

/* The pinned ggml's prototype (ggml-backend.h). Writes data[0, size) to the tensor's bytes
 * [offset, offset + size); aborts on a violated check (above). */
FAKEGGML_API void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data,
                                          size_t offset, size_t size);
/* The pinned ggml's prototype (ggml-backend.h). Copies the tensor's bytes [offset, offset +
 * size) to data[0, size); aborts on a violated check (above). */
FAKEGGML_API void ggml_backend_tensor_get(const struct ggml_tensor *tensor, void *data,
                                          size_t offset, size_t size);

/* ---- fake-only API --------------------------------------------------------------------------- */

/* A tensor of nbytes zeroed bytes in a buffer of its own, named name (truncated), or NULL when
 * memory is short or nbytes is 0. The caller owns it: fakeggml_tensor_free. */
FAKEGGML_API struct ggml_tensor *fakeggml_tensor_new(const char *name, size_t nbytes);
/* Frees a tensor of fakeggml_tensor_new and its buffer; accepts NULL. */
FAKEGGML_API void fakeggml_tensor_free(struct ggml_tensor *tensor);

#ifdef __cplusplus
}
#endif
#endif
