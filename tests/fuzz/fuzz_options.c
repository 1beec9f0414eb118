/* libFuzzer harness for the options parser (core/options: sizes "4G"/"512MiB", booleans, enums,
 * flag lists "cuda|kvo", names, uid lists, paths; style.md §6).
 *
 * Input: the first byte picks a row of KVS_OPTION_TABLE, the rest is its value (NUL-free prefix).
 * Properties (abort() = a finding):
 *   - kvs_options_set returns 0, -EINVAL or -ERANGE, and leaves the options unchanged on error;
 *   - an accepted SIZE/INT value lies within the row's [min, max];
 *   - an accepted value renders (kvs_options_format_value) to a canonical string that parses
 *     back to the same options (round trip), and renders again to the same string;
 *   - kvs_options_load on an environment made of the input's lines (logging off) always
 *     returns >= 0 and leaves every SIZE/INT field within its bounds. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "options.h"

static void check_bounds(const kvs_options_t *o) {
#define KVS__B_BOOL(f, lo, hi)
#define KVS__B_ENUM(f, lo, hi)
#define KVS__B_FLAGS(f, lo, hi)
#define KVS__B_STR(f, lo, hi) if (!memchr(o->f, 0, sizeof o->f)) abort();
#define KVS__B_NAME(f, lo, hi) if (!memchr(o->f, 0, sizeof o->f)) abort();
#define KVS__B_UIDS(f, lo, hi) if (!memchr(o->f, 0, sizeof o->f)) abort();
#define KVS__B_SIZE(f, lo, hi) if (o->f < (uint64_t)(lo) || o->f > (uint64_t)(hi)) abort();
#define KVS__B_INT(f, lo, hi) if (o->f < (int64_t)(lo) || o->f > (int64_t)(hi)) abort();
#define KVS__B(f, env, type, def, lo, hi, choices, unit, help) KVS__B_##type(f, lo, hi)
  KVS_OPTION_TABLE(KVS__B)
#undef KVS__B
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int once;
  if (!once) {
    kvs_log_set_level(KVS_LOG_OFF);
    once = 1;
  }
  if (size < 1 || size > 4096) return 0;
  char val[4097];
  memcpy(val, data + 1, size - 1);
  val[size - 1] = '\0';
  kvs_option_id_t id = (kvs_option_id_t)(data[0] % KVS_OPT__COUNT);
  kvs_options_t o, before, again;
  kvs_options_defaults(&o);
  before = o;
  int rc = kvs_options_set(&o, id, val);
  if (rc != 0 && rc != -EINVAL && rc != -ERANGE) abort();
  if (rc != 0 && memcmp(&o, &before, sizeof o) != 0) abort();
  check_bounds(&o);
  if (rc == 0) {
    char canon[1024], canon2[1024];
    kvs_options_format_value(&o, id, canon, sizeof canon);
    kvs_options_defaults(&again);
    if (kvs_options_set(&again, id, canon) != 0) abort();
    kvs_options_format_value(&again, id, canon2, sizeof canon2);
    if (strcmp(canon, canon2) != 0) abort();
  }
  /* The same bytes as an environment block: lines "NAME=value". */
  char *env[33];
  int n = 0;
  for (char *s = val; *s && n < 32;) {
    env[n++] = s;
    char *nl = strchr(s, '\n');
    if (!nl) break;
    *nl = '\0';
    s = nl + 1;
  }
  env[n] = NULL;
  kvs_options_t e;
  if (kvs_options_load(&e, env, 0) < 0) abort();
  check_bounds(&e);
  return 0;
}
