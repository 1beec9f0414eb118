/* libFuzzer harness for the options parser (core/options: sizes "4G"/"512MiB", booleans, enums,
 * flag lists "cuda|kvo", names, uid lists, paths; style.md §6).
 *
 * Input: the first byte picks a row of the process's table (runtime/rows.h: every layer's rows),
 * the rest is its value (NUL-free prefix).
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
#include "rows.h"

static void check_bounds(const kvs_config_t *c) {
  const kvs_option_table_t *t = kvs_config_rows();
  for (unsigned i = 0; i < t->n; i++) {
    const kvs_option_row_t *r = &t->rows[i];
    const char *f = (const char *)c + r->offset;
    uint64_t u;
    int64_t v;
    switch (r->type) {
      case KVS_OPTION_SIZE:
        memcpy(&u, f, sizeof u);
        if (u < r->lo || u > r->hi) abort();
        break;
      case KVS_OPTION_INT:
        memcpy(&v, f, sizeof v);
        if (v < (int64_t)r->lo || v > (int64_t)r->hi) abort();
        break;
      case KVS_OPTION_STR:
      case KVS_OPTION_NAME:
      case KVS_OPTION_UIDS:
        if (!memchr(f, 0, KVS_OPT_STR_MAX)) abort();
        break;
      default: break;
    }
  }
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
  kvs_config_t o, before, again;
  kvs_config_defaults(&o);
  before = o;
  int rc = kvs_config_set(&o, id, val);
  if (rc != 0 && rc != -EINVAL && rc != -ERANGE) abort();
  if (rc != 0 && memcmp(&o, &before, sizeof o) != 0) abort();
  check_bounds(&o);
  if (rc == 0) {
    char canon[1024], canon2[1024];
    kvs_config_format_value(&o, id, canon, sizeof canon);
    kvs_config_defaults(&again);
    if (kvs_config_set(&again, id, canon) != 0) abort();
    kvs_config_format_value(&again, id, canon2, sizeof canon2);
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
  kvs_config_t e;
  if (kvs_config_load(&e, env, 0) < 0) abort();
  check_bounds(&e);
  return 0;
}
