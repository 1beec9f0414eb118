/* kvshim options: see options.h. */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"

extern char **environ;

typedef kvs_option_row_t opt_row_t;

static const opt_row_t core_rows[KVS_OPT__CORE] = {
#define KVS__OPT_ROW(...) KVS_OPTION_ROW(kvs_options_t, __VA_ARGS__)
    KVS_CORE_OPTIONS(KVS__OPT_ROW)
#undef KVS__OPT_ROW
};
const kvs_option_table_t kvs_options_core = {core_rows, KVS_OPT__CORE, sizeof(kvs_options_t)};

/* ---- parsers ----------------------------------------------------------------------------- */

int kvs__parse_bool(const char *s, int *out) {
  static const char *const yes[] = {"1", "true", "on", "yes"};
  static const char *const no[] = {"0", "false", "off", "no"};
  for (unsigned i = 0; i < KVS__ARRAY_LEN(yes); i++) {
    if (strcasecmp(s, yes[i]) == 0) return *out = 1, 0;
    if (strcasecmp(s, no[i]) == 0) return *out = 0, 0;
  }
  return -EINVAL;
}

int kvs__parse_size(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s)) return -EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -ERANGE;
  while (*end == ' ') end++;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'B': shift = 0; end++; break;
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: return -EINVAL;
  }
  if (shift) { /* optional "B" or "iB" after the unit letter */
    if (*end == 'i' || *end == 'I') {
      end++;
      if (*end != 'B' && *end != 'b') return -EINVAL;
    }
    if (*end == 'B' || *end == 'b') end++;
  }
  if (*end) return -EINVAL;
  if (shift && v > (UINT64_MAX >> shift)) return -ERANGE;
  *out = (uint64_t)v << shift;
  return 0;
}

static int parse_int(const char *s, int64_t *out) {
  if (!*s) return -EINVAL;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno) return -ERANGE;
  if (*end) return -EINVAL;
  *out = v;
  return 0;
}

/* Index of word [w, w+n) in a '|'-separated list, or -1. */
static int choice_index(const char *choices, const char *w, size_t n) {
  int idx = 0;
  for (const char *p = choices; *p; idx++) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncasecmp(p, w, n) == 0) return idx;
    if (!bar) break;
    p = bar + 1;
  }
  return -1;
}

static int parse_flags(const char *choices, const char *s, unsigned *out) {
  if (strcasecmp(s, "auto") == 0) return *out = KVS_HOOKS_AUTO, 0;
  unsigned mask = 0;
  const char *p = s;
  if (!*p) return -EINVAL;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    int i = choice_index(choices, p, n);
    if (i < 0) return -EINVAL;
    mask |= 1u << i;
    if (!comma) break;
    p = comma + 1;
  }
  *out = mask;
  return 0;
}

static int valid_name(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '.' && *s != '_' && *s != '-') return 0;
  return 1;
}

static int valid_uids(const char *s) {
  for (const char *p = s; *p;) {
    if (!isdigit((unsigned char)*p)) return 0;
    char *end;
    errno = 0;
    unsigned long v = strtoul(p, &end, 10);
    if (errno || v > UINT32_MAX - 1) return 0;
    p = end;
    if (*p == ',') {
      p++;
      if (!*p) return 0;
    } else if (*p) {
      return 0;
    }
  }
  return 1;
}

/* Parse value for row r into the block; written only when valid. Returns 0, -EINVAL
 * (malformed) or -ERANGE (out of bounds). */
static int set_row(void *block, const opt_row_t *r, const char *value) {
  char *field = (char *)block + r->offset;
  switch (r->type) {
    case KVS_OPTION_BOOL: {
      int b;
      KVS_TRY(kvs__parse_bool(value, &b));
      *(int *)field = b;
      return 0;
    }
    case KVS_OPTION_SIZE: {
      uint64_t v;
      KVS_TRY(kvs__parse_size(value, &v));
      if (v < r->lo || v > r->hi) return -ERANGE;
      *(uint64_t *)field = v;
      return 0;
    }
    case KVS_OPTION_INT: {
      int64_t v;
      KVS_TRY(parse_int(value, &v));
      if (v < (int64_t)r->lo || v > (int64_t)r->hi) return -ERANGE;
      *(int64_t *)field = v;
      return 0;
    }
    case KVS_OPTION_ENUM: {
      int i = choice_index(r->choices, value, strlen(value));
      if (i < 0) return -EINVAL;
      *(int *)field = i;
      return 0;
    }
    case KVS_OPTION_FLAGS: {
      unsigned m;
      KVS_TRY(parse_flags(r->choices, value, &m));
      *(unsigned *)field = m;
      return 0;
    }
    case KVS_OPTION_NAME:
      if (!valid_name(value)) return -EINVAL;
      /* fall through */
    case KVS_OPTION_STR:
    case KVS_OPTION_UIDS:
      if (strlen(value) >= KVS_OPT_STR_MAX) return -ERANGE;
      if (r->type == KVS_OPTION_UIDS && !valid_uids(value)) return -EINVAL;
      strcpy(field, value);
      return 0;
  }
  return -EINVAL;
}

static const char *type_hint(const opt_row_t *r, char *buf, size_t cap) {
  switch (r->type) {
    case KVS_OPTION_BOOL: return "a boolean (1/0, true/false, on/off, yes/no)";
    case KVS_OPTION_SIZE: return "a size in bytes (suffix K/M/G/T, KiB/MiB/GiB/TiB)";
    case KVS_OPTION_INT: return "an integer";
    case KVS_OPTION_ENUM: snprintf(buf, cap, "one of %s", r->choices); return buf;
    case KVS_OPTION_FLAGS: snprintf(buf, cap, "auto or a comma list of %s", r->choices); return buf;
    case KVS_OPTION_NAME: return "a name of letters, digits, '.', '_' or '-'";
    case KVS_OPTION_STR: return "a string";
    case KVS_OPTION_UIDS: return "a comma list of numeric uids";
  }
  return "?";
}

/* What is wrong with a value set_row refused with rc: "is out of range [lo, hi] unit" or
 * "is not <what the row takes>". */
static const char *describe_bad(const opt_row_t *r, int rc, char *buf, size_t cap) {
  char hint[128];
  if (rc == -ERANGE && (r->type == KVS_OPTION_SIZE || r->type == KVS_OPTION_INT))
    snprintf(buf, cap, "is out of range [%" PRIu64 ", %" PRIu64 "]%s%s", r->lo, r->hi,
             r->unit[0] ? " " : "", r->unit);
  else
    snprintf(buf, cap, "is not %s", type_hint(r, hint, sizeof hint));
  return buf;
}

const char *kvs_options_describe_bad(const kvs_option_table_t *t, kvs_option_id_t id, int rc,
                                     char *buf, size_t cap) {
  if (id >= t->n) {
    snprintf(buf, cap, "is not valid");
    return buf;
  }
  return describe_bad(&t->rows[id], rc, buf, cap);
}

void kvs_options_defaults_rows(const kvs_option_table_t *t, void *block) {
  memset(block, 0, t->size);
  for (unsigned i = 0; i < t->n; i++) {
    int rc = set_row(block, &t->rows[i], t->rows[i].def);
    (void)rc; /* the table's own defaults always parse: test_options checks every row */
  }
}

void kvs_options_defaults(kvs_options_t *o) { kvs_options_defaults_rows(&kvs_options_core, o); }

static const char *env_lookup(char *const *envp, const char *name) {
  size_t n = strlen(name);
  for (char *const *e = envp; *e; e++)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  return NULL;
}

static void default_run_dir(kvs_options_t *o, char *const *envp) {
  const char *xdg = env_lookup(envp, "XDG_RUNTIME_DIR");
  int n;
  if (xdg && xdg[0] == '/')
    n = snprintf(o->run_dir, sizeof o->run_dir, "%s/kvshim", xdg);
  else
    n = snprintf(o->run_dir, sizeof o->run_dir, "/tmp/kvshim-%u", (unsigned)getuid());
  if (n < 0 || (size_t)n >= sizeof o->run_dir)
    snprintf(o->run_dir, sizeof o->run_dir, "/tmp/kvshim-%u", (unsigned)getuid());
}

static void apply_log(const kvs_options_t *o) {
  kvs_log_set_level((kvs_log_level_t)o->log);
  if (o->log_file[0]) {
    int fd = open(o->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0)
      kvs_log_set_fd(fd); /* kept open for the life of the process */
    else
      kvs_log_warn("KVSHIM_LOG_FILE='%s' cannot be opened (%s); logging to stderr",
                   o->log_file, strerror(errno));
  }
}

int kvs_options_load_rows(const kvs_option_table_t *t, void *block, char *const *envp,
                          unsigned flags) {
  if (!envp) envp = environ;
  kvs_options_defaults_rows(t, block);
  kvs_options_t *o = block; /* the head of every block */
  default_run_dir(o, envp);
  const opt_row_t *rows = t->rows;
  unsigned n_rows = t->n < KVS_OPT_MAX ? t->n : KVS_OPT_MAX;

  /* Pass 1: parse silently, remembering what was wrong. */
  const char *bad_value[KVS_OPT_MAX] = {0};
  int bad_rc[KVS_OPT_MAX] = {0};
  for (unsigned i = 0; i < n_rows; i++) {
    const char *v = env_lookup(envp, rows[i].env);
    if (!v) continue;
    if (rows[i].type == KVS_OPTION_STR && !v[0] && i == KVS_OPT_run_dir) continue; /* empty = default */
    int rc = set_row(block, &rows[i], v);
    o->source[i] = rc == 0 ? KVS_OPT_FROM_ENV : KVS_OPT_INVALID;
    if (rc) bad_value[i] = v, bad_rc[i] = rc;
  }
  if (flags & KVS_OPTIONS_APPLY_LOG) apply_log(o);

  /* Pass 2: one warning per problem, now that the log level is known. */
  int problems = 0;
  for (unsigned i = 0; i < n_rows; i++) {
    if (o->source[i] != KVS_OPT_INVALID) continue;
    problems++;
    char what[192], def[64];
    kvs_options_format_value(t, block, i, def, sizeof def);
    kvs_log_warn("%s='%s' %s; keeping default %s", rows[i].env, bad_value[i],
                 describe_bad(&rows[i], bad_rc[i], what, sizeof what), def[0] ? def : "(empty)");
  }
  for (char *const *e = envp; *e; e++) {
    if (strncmp(*e, "KVSHIM_", 7) != 0) continue;
    const char *eq = strchr(*e, '=');
    size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
    int known = 0;
    for (unsigned i = 0; i < n_rows && !known; i++)
      known = strlen(rows[i].env) == n && strncmp(rows[i].env, *e, n) == 0;
    if (!known) {
      o->unknown_vars++;
      problems++;
      kvs_log_warn("unknown variable %.*s ignored (kvshim --help lists the KVSHIM_* variables)",
                   (int)n, *e);
    }
  }
  return problems;
}

int kvs_options_load(kvs_options_t *o, char *const *envp, unsigned flags) {
  return kvs_options_load_rows(&kvs_options_core, o, envp, flags);
}

/* A size bound as the variables' values are written: 1048576 -> "1M", 0 -> "0". */
static void format_size(uint64_t v, char *buf, size_t cap) {
  static const char units[] = "KMGT";
  int u = -1;
  while (v && u < 3 && (v & 1023) == 0) v >>= 10, u++;
  if (u >= 0)
    snprintf(buf, cap, "%" PRIu64 "%c", v, units[u]);
  else
    snprintf(buf, cap, "%" PRIu64, v);
}

size_t kvs_options_format_value(const kvs_option_table_t *t, const void *block,
                                kvs_option_id_t id, char *buf, size_t cap) {
  if (cap) buf[0] = '\0';
  if (id >= t->n) return 0;
  const opt_row_t *r = &t->rows[id];
  const char *field = (const char *)block + r->offset;
  int n = 0;
  switch (r->type) {
    case KVS_OPTION_BOOL: n = snprintf(buf, cap, "%s", *(const int *)field ? "1" : "0"); break;
    case KVS_OPTION_SIZE: {
      char v[32];
      format_size(*(const uint64_t *)field, v, sizeof v);
      n = snprintf(buf, cap, "%s", v);
      break;
    }
    case KVS_OPTION_INT: n = snprintf(buf, cap, "%" PRId64, *(const int64_t *)field); break;
    case KVS_OPTION_ENUM: {
      int idx = *(const int *)field;
      const char *p = r->choices;
      for (int k = 0; k < idx && p; k++) {
        p = strchr(p, '|');
        if (p) p++;
      }
      size_t len = p ? strcspn(p, "|") : 1;
      n = snprintf(buf, cap, "%.*s", (int)len, p ? p : "?");
      break;
    }
    case KVS_OPTION_FLAGS: {
      unsigned m = *(const unsigned *)field;
      if (m & KVS_HOOKS_AUTO) {
        n = snprintf(buf, cap, "auto");
        break;
      }
      size_t len = 0;
      int idx = 0;
      for (const char *p = r->choices; *p; idx++) {
        size_t w = strcspn(p, "|");
        if (m & (1u << idx)) {
          int k = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, "%s%.*s",
                           len ? "," : "", (int)w, p);
          if (k > 0) len += (size_t)k;
        }
        p += w;
        if (*p) p++;
      }
      return len;
    }
    case KVS_OPTION_STR:
    case KVS_OPTION_NAME:
    case KVS_OPTION_UIDS: n = snprintf(buf, cap, "%s", field); break;
  }
  return n > 0 ? (size_t)n : 0;
}

size_t kvs_options_render(const kvs_option_table_t *t, const void *block, char *buf, size_t cap) {
  static const char *const src_names[] = {"default", "env", "invalid, default kept"};
  const kvs_options_t *o = block;
  size_t len = 0;
  if (cap) buf[0] = '\0';
  for (unsigned i = 0; i < t->n && i < KVS_OPT_MAX; i++) {
    char val[KVS_OPT_STR_MAX + 8];
    kvs_options_format_value(t, block, i, val, sizeof val);
    size_t room = len < cap ? cap - len : 0;
    int n = snprintf(room ? buf + len : NULL, room, "%s=%s (%s) - %s\n", t->rows[i].env, val,
                     src_names[o->source[i] <= 2 ? o->source[i] : 0], t->rows[i].help);
    if (n > 0) len += (size_t)n;
  }
  return len;
}

size_t kvs_options_usage(const kvs_option_table_t *t, char *buf, size_t cap) {
  size_t len = 0;
  if (cap) buf[0] = '\0';
  for (unsigned i = 0; i < t->n; i++) {
    const opt_row_t *r = &t->rows[i];
    char flag[64], kind[160], lo[32], hi[32];
    kvs_options_flag_name(t, i, flag, sizeof flag);
    switch (r->type) {
      case KVS_OPTION_BOOL: snprintf(kind, sizeof kind, "boolean"); break;
      case KVS_OPTION_SIZE:
        format_size(r->lo, lo, sizeof lo);
        format_size(r->hi, hi, sizeof hi);
        snprintf(kind, sizeof kind, "size %s..%s", lo, hi);
        break;
      case KVS_OPTION_INT:
        snprintf(kind, sizeof kind, "integer %" PRIu64 "..%" PRIu64 "%s%s", r->lo, r->hi,
                 r->unit[0] ? " " : "", r->unit);
        break;
      case KVS_OPTION_ENUM: snprintf(kind, sizeof kind, "one of %s", r->choices); break;
      case KVS_OPTION_FLAGS: snprintf(kind, sizeof kind, "auto or a comma list of %s", r->choices); break;
      case KVS_OPTION_NAME: snprintf(kind, sizeof kind, "name"); break;
      case KVS_OPTION_STR: snprintf(kind, sizeof kind, "string"); break;
      case KVS_OPTION_UIDS: snprintf(kind, sizeof kind, "uid list"); break;
    }
    size_t room = len < cap ? cap - len : 0;
    int n = snprintf(room ? buf + len : NULL, room, "  %s (--%s) %s, default %s: %s\n", r->env,
                     flag, kind, r->def[0] ? r->def : "(empty)", r->help);
    if (n > 0) len += (size_t)n;
  }
  return len;
}

const char *kvs_options_env_name(const kvs_option_table_t *t, kvs_option_id_t id) {
  return id < t->n ? t->rows[id].env : "?";
}

const char *kvs_options_flag_name(const kvs_option_table_t *t, kvs_option_id_t id, char *buf,
                                  size_t cap) {
  if (cap == 0) return buf;
  size_t k = 0;
  for (const char *f = id < t->n ? t->rows[id].field : "?"; *f && k + 1 < cap; f++)
    buf[k++] = *f == '_' ? '-' : *f;
  buf[k] = '\0';
  return buf;
}

int kvs_options_find(const kvs_option_table_t *t, const char *name, kvs_option_id_t *out) {
  for (unsigned i = 0; i < t->n; i++)
    if (strcmp(name, t->rows[i].env) == 0 || strcmp(name, t->rows[i].field) == 0) {
      *out = i;
      return 0;
    }
  return -ENOENT;
}

int kvs_options_set(const kvs_option_table_t *t, void *block, kvs_option_id_t id,
                    const char *value) {
  if (id >= t->n || id >= KVS_OPT_MAX || !value) return -EINVAL;
  KVS_TRY(set_row(block, &t->rows[id], value)); /* writes nothing unless valid */
  ((kvs_options_t *)block)->source[id] = KVS_OPT_FROM_ENV;
  return 0;
}

int kvs_options_uid_allowed(const kvs_options_t *o, uid_t uid) {
  if (uid == getuid()) return 1;
  for (const char *p = o->allow_uids; *p;) {
    char *end;
    unsigned long v = strtoul(p, &end, 10);
    if (end == p) break;
    if ((uid_t)v == uid) return 1;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}
