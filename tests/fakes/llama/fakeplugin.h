/* tests/fakes/llama: the plugin's one entry point. libfakeplugin.so links libfakellama.so and
 * calls it through its PLT, as node-llama-cpp's addon calls libllama; a host opens the plugin
 * with dlopen(RTLD_LOCAL), as Node opens an addon, so neither library is in the global scope
 * (dlsym(RTLD_NEXT) and dlsym(RTLD_DEFAULT) from elsewhere see nothing of them). */
#ifndef KVSHIM_FAKEPLUGIN_H
#define KVSHIM_FAKEPLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FAKEPLUGIN_API_VERSION 1

/* Handles are opaque: models and contexts of libfakellama. ext selects the _ext variant of a
 * state function (with flags). */
typedef struct fakeplugin_api {
  uint32_t version; /* FAKEPLUGIN_API_VERSION */
  void *(*model_load)(const char *path);
  void (*model_free)(void *model);
  void *(*ctx_new)(void *model, uint32_t n_seq, uint32_t kv_type);
  void (*ctx_free)(void *ctx);
  int32_t (*decode)(void *ctx, int32_t seq, const int32_t *tokens, int32_t n);
  void (*seq_clear)(void *ctx, int32_t seq);
  int (*seq_check)(void *ctx, int32_t seq, const int32_t *tokens, size_t n);
  size_t (*seq_save_file)(void *ctx, const char *path, int32_t seq, const int32_t *tokens,
                          size_t n);
  size_t (*seq_load_file)(void *ctx, const char *path, int32_t seq, int32_t *tokens_out,
                          size_t cap, size_t *n_out);
  size_t (*seq_get_size)(void *ctx, int32_t seq, bool ext, uint32_t flags);
  size_t (*seq_get_data)(void *ctx, uint8_t *dst, size_t size, int32_t seq, bool ext,
                         uint32_t flags);
  size_t (*seq_set_data)(void *ctx, const uint8_t *src, size_t size, int32_t seq, bool ext,
                         uint32_t flags);
  bool (*state_save_file)(void *ctx, const char *path, const int32_t *tokens, size_t n);
  bool (*state_load_file)(void *ctx, const char *path, int32_t *tokens_out, size_t cap,
                          size_t *n_out);
} fakeplugin_api_t;

/* The entry point (the only symbol the plugin exports). */
typedef const fakeplugin_api_t *(*fakeplugin_api_fn)(void);
#define FAKEPLUGIN_ENTRY "fakeplugin_api"

#endif
