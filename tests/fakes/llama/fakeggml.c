/* tests/fakes/llama: see fakeggml.h. Test code: plain malloc and stdio. */
#include "fakeggml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A host buffer: what a tensor's bytes lie in (ggml's CPU buffer, one per tensor here). */
struct ggml_backend_buffer {
  void *base; /* size bytes */
  size_t size;
};

/* GGML_ASSERT's end: the failed condition on stderr, then abort (ggml.c ggml_abort). fn: the
 * entry point whose check failed. */
_Noreturn static void assert_failed(const char *fn, const struct ggml_tensor *t, const char *cond,
                                    size_t offset, size_t size) {
  fprintf(stderr,
          "fakeggml: %s: GGML_ASSERT(%s) failed (tensor %s, offset %zu, size %zu, nbytes %zu)\n",
          fn, cond, t ? t->name : "(null)", offset, size, t ? t->nbytes : 0);
  abort();
}

/* The pinned ggml-backend.cpp:335-348, check for check and in its order: the tensor, its
 * buffer (a view's buffer is its source's; the fake has no views), size 0 returns, its data,
 * the bounds; then the buffer's set_tensor, on a CPU buffer a memcpy. offset + size is checked
 * without overflow. */
void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset,
                             size_t size) {
  static const char fn[] = "ggml_backend_tensor_set";
  if (!tensor) assert_failed(fn, tensor, "tensor", offset, size);
  if (!tensor->buffer)
    assert_failed(fn, tensor, "buf != NULL && \"tensor buffer not set\"", offset, size);
  if (size == 0) return;
  if (!tensor->data)
    assert_failed(fn, tensor, "tensor->data != NULL && \"tensor not allocated\"", offset, size);
  if (size > tensor->nbytes || offset > tensor->nbytes - size)
    assert_failed(fn, tensor,
                  "offset + size <= ggml_nbytes(tensor) && \"tensor write out of bounds\"",
                  offset, size);
  memcpy((unsigned char *)tensor->data + offset, data, size);
}

/* The pinned ggml-backend.cpp:350-363, the same checks in the same order (the bounds check's
 * message says "read"); then the buffer's get_tensor, on a CPU buffer a memcpy out of the
 * tensor's bytes. */
void ggml_backend_tensor_get(const struct ggml_tensor *tensor, void *data, size_t offset,
                             size_t size) {
  static const char fn[] = "ggml_backend_tensor_get";
  if (!tensor) assert_failed(fn, tensor, "tensor", offset, size);
  if (!tensor->buffer)
    assert_failed(fn, tensor, "buf != NULL && \"tensor buffer not set\"", offset, size);
  if (size == 0) return;
  if (!tensor->data)
    assert_failed(fn, tensor, "tensor->data != NULL && \"tensor not allocated\"", offset, size);
  if (size > tensor->nbytes || offset > tensor->nbytes - size)
    assert_failed(fn, tensor,
                  "offset + size <= ggml_nbytes(tensor) && \"tensor read out of bounds\"",
                  offset, size);
  memcpy(data, (const unsigned char *)tensor->data + offset, size);
}

struct ggml_tensor *fakeggml_tensor_new(const char *name, size_t nbytes) {
  if (nbytes == 0) return NULL;
  struct ggml_tensor *t = calloc(1, sizeof *t);
  struct ggml_backend_buffer *b = calloc(1, sizeof *b);
  void *base = calloc(1, nbytes);
  if (!t || !b || !base) {
    free(t);
    free(b);
    free(base);
    return NULL;
  }
  b->base = base;
  b->size = nbytes;
  t->buffer = b;
  t->data = base;
  t->nbytes = nbytes;
  snprintf(t->name, sizeof t->name, "%s", name ? name : "");
  return t;
}

void fakeggml_tensor_free(struct ggml_tensor *tensor) {
  if (!tensor) return;
  if (tensor->buffer) free(tensor->buffer->base);
  free(tensor->buffer);
  free(tensor);
}
