/* tests/fakes/llama: see fakeggml.h. Test code: plain malloc and stdio. */
#include "fakeggml.h"

#include <stdbool.h>
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

/* The checks both pinned functions make, check for check and in their order
 * (ggml-backend.cpp:335-348 set, 350-363 get): the tensor, its buffer (a view's buffer is its
 * source's; the fake has no views), size 0 returns (false), its data, the bounds (offset + size
 * checked without overflow; `bounds`: the assertion's text, "write" or "read"). */
static bool access_ok(const char *fn, const struct ggml_tensor *tensor, size_t offset, size_t size,
                      const char *bounds) {
  if (!tensor) assert_failed(fn, tensor, "tensor", offset, size);
  if (!tensor->buffer)
    assert_failed(fn, tensor, "buf != NULL && \"tensor buffer not set\"", offset, size);
  if (size == 0) return false;
  if (!tensor->data)
    assert_failed(fn, tensor, "tensor->data != NULL && \"tensor not allocated\"", offset, size);
  if (size > tensor->nbytes || offset > tensor->nbytes - size)
    assert_failed(fn, tensor, bounds, offset, size);
  return true;
}

/* Then the buffer's set_tensor: on a CPU buffer a memcpy into the tensor's bytes. */
void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset,
                             size_t size) {
  if (access_ok("ggml_backend_tensor_set", tensor, offset, size,
                "offset + size <= ggml_nbytes(tensor) && \"tensor write out of bounds\""))
    memcpy((unsigned char *)tensor->data + offset, data, size);
}

/* Then the buffer's get_tensor: on a CPU buffer a memcpy out of the tensor's bytes. */
void ggml_backend_tensor_get(const struct ggml_tensor *tensor, void *data, size_t offset,
                             size_t size) {
  if (access_ok("ggml_backend_tensor_get", tensor, offset, size,
                "offset + size <= ggml_nbytes(tensor) && \"tensor read out of bounds\""))
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
