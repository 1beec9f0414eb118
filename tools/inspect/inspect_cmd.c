/* kvshim inspect: prints a kvs_elf_report_t as a human table or one JSON document. */
#include "inspect_cmd.h"

#include <elf.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elfscan.h"

enum { EXIT_OK = 0, EXIT_BAD_BINARY = 1, EXIT_USAGE = 2 };

const char kvs_inspect_help[] =
    "usage: kvshim inspect BINARY [--json] [--ld-cache FILE] [--no-ldconfig]\n"
    "Resolves BINARY's DT_NEEDED closure as the dynamic loader would (RPATH/RUNPATH with\n"
    "$ORIGIN, LD_LIBRARY_PATH, /etc/ld.so.cache, default directories) and, for each hook family\n"
    "(CUDA driver, llama.cpp, kvo), reports where every hook is defined, which objects import\n"
    "it, and whether LD_PRELOAD can interpose the calls; when not, why (static link, defined in\n"
    "the executable, -Bsymbolic, -Bsymbolic-functions, protected or hidden visibility, or\n"
    "unreached: exported but called through no relocation, e.g. a library linked in\n"
    "statically). Calls inside a defining object are listed too: through the PLT\n"
    "(interposable) or bound. Each feature (llama.cpp: state adapter, prefix cache) is\n"
    "reported available, or lost with the hook that fails it and why.\n"
    "Objects opened with dlopen at run time (plugins) are not in the closure: inspect them.\n"
    "LD_LIBRARY_PATH is taken from the environment, as the loader would.\n"
    "  --json           one JSON document instead of the table\n"
    "  --ld-cache FILE  read FILE instead of /etc/ld.so.cache\n"
    "  --no-ldconfig    do not fall back to `ldconfig -p` when the cache is unreadable\n"
    "exit codes: 0 ok, 1 BINARY unreadable or not an ELF executable/shared library, 2 usage\n";

/* ---- helpers ------------------------------------------------------------------------------- */

static const char *vis_name(unsigned v) {
  return v == STV_DEFAULT         ? "default"
         : v == STV_PROTECTED     ? "protected"
         : v == STV_HIDDEN        ? "hidden"
         : v == STV_INTERNAL      ? "internal"
         : v == KVS_ELF_VIS_LOCAL ? "local"
                                  : "?";
}

static const char *obj_name(const kvs_elf_report_t *r, size_t i) {
  return i < r->n_objects ? kvs_elf_object_basename(&r->objects[i]) : "?";
}

/* "plt", "got", "plt+got", "data"... for an import's relocations; "ref" when there is none. */
static void reloc_kinds(const kvs_elf_use_t *u, char *buf, size_t n) {
  snprintf(buf, n, "%s%s%s%s%s", u->jump_slot ? "plt" : "",
           u->jump_slot && (u->glob_dat || u->other_relocs) ? "+" : "", u->glob_dat ? "got" : "",
           u->glob_dat && u->other_relocs ? "+" : "", u->other_relocs ? "data" : "");
  if (buf[0] == '\0') snprintf(buf, n, "ref");
}

static unsigned internal_relocs(const kvs_elf_use_t *u) {
  return u->jump_slot + u->glob_dat + u->other_relocs;
}

/* Whether a definer's own dynamic relocations against the hook are bound by the loader in the
 * global order (interposable). Direct calls alone make the use's reason SYMBOLIC_FUNCTIONS,
 * which leaves its relocations interposable. */
static bool relocs_interposable(const kvs_elf_use_t *u) {
  return u->reason == KVS_ELF_REASON_NONE || u->reason == KVS_ELF_REASON_SYMBOLIC_FUNCTIONS;
}

static unsigned missing_objects(const kvs_elf_report_t *r) {
  unsigned n = 0;
  for (size_t i = 0; i < r->n_objects; i++) n += r->objects[i].path == NULL;
  return n;
}

/* The definer named in a family's line: unresolved when a needed object was not found. */
static const char *definer_text(const kvs_elf_report_t *r, const kvs_elf_family_summary_t *sum) {
  if (sum->definer >= 0) return obj_name(r, (size_t)sum->definer);
  return missing_objects(r) ? "unresolved (a needed object was not found)" : NULL;
}

static void jstr(FILE *o, const char *s);

/* ---- human table --------------------------------------------------------------------------- */

typedef struct row {
  const char *hook;
  char defined[160];
  char verdict[48];
  char *imports; /* malloc'd; NULL = "-" */
} row_t;

static char *append(char *s, const char *add) {
  size_t a = s ? strlen(s) : 0, b = strlen(add);
  char *n = realloc(s, a + b + 1);
  if (n == NULL) {
    free(s);
    return NULL;
  }
  memcpy(n + a, add, b + 1);
  return n;
}

static int fill_row(const kvs_elf_report_t *r, const kvs_elf_symbol_t *s, row_t *row) {
  row->hook = kvs_elf_hook_name(s->hook);
  unsigned shadowed = 0;
  int first_internal = -1;
  for (size_t k = 0; k < s->n_uses; k++) {
    const kvs_elf_use_t *u = &s->uses[k];
    if (u->def == KVS_ELF_DEF_EXPORTED && (int)u->object != s->definer) shadowed++;
    if (u->def == KVS_ELF_DEF_INTERNAL && first_internal < 0) first_internal = (int)u->object;
  }
  if (s->definer >= 0) {
    const kvs_elf_use_t *d = NULL;
    for (size_t k = 0; k < s->n_uses && !d; k++)
      if ((int)s->uses[k].object == s->definer) d = &s->uses[k];
    snprintf(row->defined, sizeof row->defined, "%s%s%s", obj_name(r, (size_t)s->definer),
             d && d->visibility == STV_PROTECTED ? " (protected)" : "",
             shadowed ? " (+ shadowed copies)" : "");
  } else if (first_internal >= 0) {
    snprintf(row->defined, sizeof row->defined, "%s (not exported)",
             obj_name(r, (size_t)first_internal));
  } else {
    snprintf(row->defined, sizeof row->defined, "- (unresolved)");
  }
  if (s->verdict == KVS_ELF_YES)
    snprintf(row->verdict, sizeof row->verdict, "yes");
  else
    snprintf(row->verdict, sizeof row->verdict, "%s (%s)", kvs_elf_verdict_name(s->verdict),
             kvs_elf_reason_name(s->reason));
  row->imports = NULL;
  for (size_t k = 0; k < s->n_uses; k++) {
    const kvs_elf_use_t *u = &s->uses[k];
    if (u->def != KVS_ELF_DEF_NONE) continue;
    char kinds[32], item[320];
    reloc_kinds(u, kinds, sizeof kinds);
    snprintf(item, sizeof item, "%s%s (%s%s%s)", row->imports ? ", " : "", obj_name(r, u->object),
             kinds, u->interposable ? "" : ", bound: ",
             u->interposable ? "" : kvs_elf_reason_name((kvs_elf_reason_t)u->reason));
    if ((row->imports = append(row->imports, item)) == NULL) return -ENOMEM;
  }
  return 0;
}

/* lead, then the names separated by ", ", wrapped at about 100 columns under the first. */
static void print_list(FILE *o, const char *lead, const char *const *names, unsigned n) {
  if (n == 0) return;
  int indent = (int)strlen(lead);
  size_t col = (size_t)fprintf(o, "%s%s", lead, names[0]);
  for (unsigned k = 1; k < n; k++) {
    if (col + strlen(names[k]) + 2 > 100)
      col = (size_t)fprintf(o, ",\n%*s%s", indent, "", names[k]) - 2;
    else
      col += (size_t)fprintf(o, ", %s", names[k]);
  }
  fputc('\n', o);
}

/* One line per feature of family f that is present: "  prefix cache: available", or
 * "  prefix cache: lost, llama_decode not interposable (unreached): <what is lost>". */
static void print_features(FILE *o, const kvs_elf_report_t *r, kvs_elf_family_t f) {
  for (unsigned k = 0; k < KVS_ELF_FEATURE_COUNT; k++) {
    kvs_elf_feature_status_t st;
    if (kvs_elf_feature_family((kvs_elf_feature_t)k) != f ||
        kvs_elf_feature_check(r, (kvs_elf_feature_t)k, &st) < 0 ||
        st.state == KVS_ELF_FEATURE_ABSENT)
      continue;
    fprintf(o, "  %s: %s", kvs_elf_feature_name((kvs_elf_feature_t)k),
            kvs_elf_feature_state_name(st.state));
    if (st.state == KVS_ELF_FEATURE_LOST) {
      if (st.verdict == KVS_ELF_ABSENT)
        fprintf(o, ", %s not present", kvs_elf_hook_name(st.hook));
      else
        fprintf(o, ", %s not interposable (%s)", kvs_elf_hook_name(st.hook),
                kvs_elf_reason_name(st.reason));
      fprintf(o, ": %s", kvs_elf_feature_lost_text((kvs_elf_feature_t)k));
    }
    fputc('\n', o);
  }
}

/* The family's features as a JSON array (every feature of f, absent ones included). */
static void json_features(FILE *o, const kvs_elf_report_t *r, kvs_elf_family_t f) {
  fputs(",\n   \"features\": [", o);
  bool first = true;
  for (unsigned k = 0; k < KVS_ELF_FEATURE_COUNT; k++) {
    kvs_elf_feature_status_t st;
    if (kvs_elf_feature_family((kvs_elf_feature_t)k) != f ||
        kvs_elf_feature_check(r, (kvs_elf_feature_t)k, &st) < 0)
      continue;
    bool lost = st.state == KVS_ELF_FEATURE_LOST;
    fprintf(o, "%s{\"name\": \"%s\", \"state\": \"%s\", \"hook\": ", first ? "" : ", ",
            kvs_elf_feature_name((kvs_elf_feature_t)k), kvs_elf_feature_state_name(st.state));
    jstr(o, lost ? kvs_elf_hook_name(st.hook) : NULL);
    fputs(", \"reason\": ", o);
    jstr(o, lost ? (st.verdict == KVS_ELF_ABSENT ? "not-present" : kvs_elf_reason_name(st.reason))
                 : NULL);
    fputs(", \"lost\": ", o);
    jstr(o, lost ? kvs_elf_feature_lost_text((kvs_elf_feature_t)k) : NULL);
    fputc('}', o);
    first = false;
  }
  fputc(']', o);
}

static int print_family(FILE *o, const kvs_elf_report_t *r, kvs_elf_family_t f) {
  kvs_elf_hook_t first;
  unsigned count;
  kvs_elf_family_summary_t sum;
  if (kvs_elf_family_hooks(f, &first, &count) < 0 || kvs_elf_family_summarize(r, f, &sum) < 0)
    return -EINVAL;
  char line[512];
  if (sum.present == 0) {
    fprintf(o,
            "%s: not present (no object of the closure defines or imports one of its %u hooks)\n\n",
            kvs_elf_family_title(f), count);
    return 0;
  }
  kvs_elf_summary_line(line, sizeof line, kvs_elf_family_title(f), definer_text(r, &sum), sum.yes,
                       sum.present);
  fprintf(o, "%s", line);
  if (sum.partial) fprintf(o, " (%u partially)", sum.partial);
  if (sum.n_definers > 1) fprintf(o, " (defined in %u objects)", sum.n_definers);
  fputc('\n', o);
  print_features(o, r, f);

  row_t rows[KVS_ELF_FAMILY_MAX_HOOKS];
  unsigned n = 0;
  int rc = 0;
  size_t wh = 4, wd = 10, wv = 12;
  for (unsigned k = 0; k < count && rc == 0; k++) {
    const kvs_elf_symbol_t *s = &r->symbols[first + k];
    if (s->verdict == KVS_ELF_ABSENT) continue;
    rc = fill_row(r, s, &rows[n]);
    if (rc < 0) break;
    if (strlen(rows[n].hook) > wh) wh = strlen(rows[n].hook);
    if (strlen(rows[n].defined) > wd) wd = strlen(rows[n].defined);
    if (strlen(rows[n].verdict) > wv) wv = strlen(rows[n].verdict);
    n++;
  }
  if (rc == 0) {
    fprintf(o, "  %-*s  %-*s  %-*s  %s\n", (int)wh, "HOOK", (int)wd, "DEFINED IN", (int)wv,
            "INTERPOSABLE", "IMPORTED BY");
    for (unsigned k = 0; k < n; k++)
      fprintf(o, "  %-*s  %-*s  %-*s  %s\n", (int)wh, rows[k].hook, (int)wd, rows[k].defined,
              (int)wv, rows[k].verdict, rows[k].imports ? rows[k].imports : "-");
  }
  for (unsigned k = 0; k < n; k++) free(rows[k].imports);
  if (rc < 0) return rc;

  const char *names[KVS_ELF_FAMILY_MAX_HOOKS];
  unsigned n_names = 0;
  for (unsigned k = 0; k < count; k++)
    if (r->symbols[first + k].verdict == KVS_ELF_ABSENT)
      names[n_names++] = kvs_elf_hook_name(first + k);
  print_list(o, "  not present: ", names, n_names);

  /* calls inside the defining objects (issue 8: does an internal call reach the hook?) */
  bool any_internal = false;
  for (unsigned k = 0; k < count; k++) {
    const kvs_elf_symbol_t *s = &r->symbols[first + k];
    for (size_t j = 0; j < s->n_uses; j++) {
      const kvs_elf_use_t *u = &s->uses[j];
      unsigned rel = u->def == KVS_ELF_DEF_NONE ? 0 : internal_relocs(u);
      if (rel == 0 && u->direct_calls <= 0) continue;
      if (!any_internal) fprintf(o, "  calls inside the defining object:\n");
      any_internal = true;
      fprintf(o, "    %s in %s:", kvs_elf_hook_name(s->hook), obj_name(r, u->object));
      if (rel) {
        char kinds[32];
        reloc_kinds(u, kinds, sizeof kinds);
        fprintf(o, " %u through the %s (%s)", rel, kinds,
                relocs_interposable(u) ? "interposable"
                                       : kvs_elf_reason_name((kvs_elf_reason_t)u->reason));
      }
      if (u->direct_calls > 0)
        fprintf(o, "%s %d direct call%s bound at link time (%s)", rel ? ";" : "", u->direct_calls,
                u->direct_calls == 1 ? "" : "s", kvs_elf_reason_name((kvs_elf_reason_t)u->reason));
      fputc('\n', o);
    }
  }
  if (!any_internal)
    fprintf(o, "  calls inside the defining object: none through the PLT, none bound\n");

  /* function tables: addresses of hooks stored in their definer (a resolver such as
   * cuGetProcAddress hands them out; calls through them never pass a PLT) */
  for (size_t i = 0; i < r->n_objects; i++) {
    n_names = 0;
    for (unsigned k = 0; k < count; k++) {
      const kvs_elf_symbol_t *s = &r->symbols[first + k];
      for (size_t j = 0; j < s->n_uses; j++)
        if (s->uses[j].object == i && s->uses[j].pointers)
          names[n_names++] = kvs_elf_hook_name(s->hook);
    }
    if (n_names == 0) continue;
    char lead[300];
    snprintf(lead, sizeof lead, "  address tables in %s: ", obj_name(r, i));
    print_list(o, lead, names, n_names);
    fputs("    (pointers handed out at run time, e.g. by a resolver: calls through them bypass "
          "the PLT)\n",
          o);
  }

  /* reasons, once each */
  bool seen[KVS_ELF_REASON_COUNT] = {false};
  for (unsigned k = 0; k < count; k++) {
    const kvs_elf_symbol_t *s = &r->symbols[first + k];
    if (s->verdict == KVS_ELF_ABSENT || s->verdict == KVS_ELF_YES || seen[s->reason]) continue;
    seen[s->reason] = true;
    fprintf(o, "  %s: %s\n", kvs_elf_reason_name(s->reason), kvs_elf_reason_text(s->reason));
  }
  fputc('\n', o);
  return 0;
}

static bool setid(const char *binary) {
  struct stat st;
  return stat(binary, &st) == 0 && (st.st_mode & (S_ISUID | S_ISGID));
}

/* Whether running binary would change our ids: the loader's secure mode (AT_SECURE). */
static bool secure_for_us(const char *binary) {
  struct stat st;
  if (stat(binary, &st) != 0) return false;
  return ((st.st_mode & S_ISUID) && st.st_uid != getuid()) ||
         ((st.st_mode & S_ISGID) && st.st_gid != getgid());
}

static int print_human(FILE *o, const char *binary, const kvs_elf_report_t *r) {
  fprintf(o, "%s: %s", binary, kvs_elf_kind_name(r->kind));
  if (r->interp) fprintf(o, ", interpreter %s", r->interp);
  fprintf(o, "\n\nobjects, in load order (LD_PRELOAD libraries come right after #0):\n");
  size_t wn = 6, wv = 9;
  for (size_t i = 0; i < r->n_objects; i++) {
    size_t len = strlen(i == 0 ? obj_name(r, 0) : r->objects[i].name);
    if (len > wn) wn = len;
    if (strlen(kvs_elf_via_name(r->objects[i].via)) > wv)
      wv = strlen(kvs_elf_via_name(r->objects[i].via));
  }
  fprintf(o, "  %4s  %-*s  %-*s  %s\n", "#", (int)wn, "OBJECT", (int)wv, "FOUND VIA", "PATH");
  unsigned missing = 0;
  for (size_t i = 0; i < r->n_objects; i++) {
    const kvs_elf_object_t *ob = &r->objects[i];
    fprintf(o, "  %4zu  %-*s  %-*s  %s", i, (int)wn, i == 0 ? obj_name(r, 0) : ob->name, (int)wv,
            kvs_elf_via_name(ob->via), ob->path ? ob->path : "-");
    if (ob->needed_by >= 0 && ob->path == NULL)
      fprintf(o, " (needed by %s)", obj_name(r, (size_t)ob->needed_by));
    if (ob->flags & KVS_ELF_OBJ_SYMBOLIC) fprintf(o, " [symbolic]");
    if (ob->error) fprintf(o, " [unreadable: %s]", ob->error);
    fputc('\n', o);
    if (ob->path == NULL) missing++;
  }
  fputc('\n', o);
  for (unsigned f = 0; f < KVS_ELF_FAMILY_COUNT; f++) {
    int rc = print_family(o, r, (kvs_elf_family_t)f);
    if (rc < 0) return rc;
  }
  if (r->kind == KVS_ELF_KIND_STATIC || r->kind == KVS_ELF_KIND_STATIC_PIE)
    fprintf(o, "note: statically linked: the dynamic loader never runs, LD_PRELOAD is ignored\n");
  if (setid(binary))
    fprintf(o, "note: set-user/group-ID program: the loader runs it in secure mode, where "
               "LD_PRELOAD only loads libraries from system directories that are set-user-ID "
               "themselves, and LD_LIBRARY_PATH is ignored\n");
  if (missing)
    fprintf(o,
            "note: %u needed object%s not found: hooks they define are reported unresolved, "
            "their imports are not seen\n",
            missing, missing == 1 ? " was" : "s were");
  fprintf(o, "note: objects opened with dlopen at run time (plugins) are not in the DT_NEEDED "
             "closure: inspect each plugin directly\n");
  return 0;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static void jstr(FILE *o, const char *s) {
  if (s == NULL) {
    fputs("null", o);
    return;
  }
  fputc('"', o);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(o, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", o);
    else if (*p == '\t')
      fputs("\\t", o);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(o, "\\u%04x", *p);
    else
      fputc(*p, o);
  }
  fputc('"', o);
}

static const char *role_name(uint8_t def) {
  return def == KVS_ELF_DEF_NONE       ? "import"
         : def == KVS_ELF_DEF_EXPORTED ? "definition"
                                       : "internal-definition";
}

static void print_json(FILE *o, const char *binary, const kvs_elf_report_t *r) {
  fputs("{\"binary\": ", o);
  jstr(o, binary);
  fprintf(o, ", \"kind\": \"%s\", \"interpreter\": ", kvs_elf_kind_name(r->kind));
  jstr(o, r->interp);
  fprintf(o, ", \"machine\": %u, \"setid\": %s,\n \"objects\": [", r->machine,
          setid(binary) ? "true" : "false");
  for (size_t i = 0; i < r->n_objects; i++) {
    const kvs_elf_object_t *ob = &r->objects[i];
    fprintf(o, "%s\n  {\"index\": %zu, \"name\": ", i ? "," : "", i);
    jstr(o, ob->name);
    fputs(", \"path\": ", o);
    jstr(o, ob->path);
    fputs(", \"soname\": ", o);
    jstr(o, ob->soname);
    fprintf(o, ", \"via\": \"%s\", \"needed_by\": ", kvs_elf_via_name(ob->via));
    if (ob->needed_by >= 0)
      fprintf(o, "%d", ob->needed_by);
    else
      fputs("null", o);
    fprintf(o,
            ", \"symbolic\": %s, \"error\": ", ob->flags & KVS_ELF_OBJ_SYMBOLIC ? "true" : "false");
    jstr(o, ob->error);
    fputc('}', o);
  }
  fputs("],\n \"families\": [", o);
  for (unsigned f = 0; f < KVS_ELF_FAMILY_COUNT; f++) {
    kvs_elf_hook_t first;
    unsigned count;
    kvs_elf_family_summary_t sum;
    kvs_elf_family_hooks((kvs_elf_family_t)f, &first, &count);
    kvs_elf_family_summarize(r, (kvs_elf_family_t)f, &sum);
    char line[512];
    kvs_elf_summary_line(line, sizeof line, kvs_elf_family_title((kvs_elf_family_t)f),
                         definer_text(r, &sum), sum.yes, sum.present);
    fprintf(o, "%s\n  {\"family\": \"%s\", \"title\": ", f ? "," : "",
            kvs_elf_family_name((kvs_elf_family_t)f));
    jstr(o, kvs_elf_family_title((kvs_elf_family_t)f));
    fputs(", \"summary\": ", o);
    if (sum.present)
      jstr(o, line);
    else
      fputs("null", o);
    fprintf(o,
            ", \"hooks\": %u, \"present\": %u, \"interposable\": %u, \"partial\": %u, "
            "\"not_interposable\": %u, \"defined_in\": ",
            count, sum.present, sum.yes, sum.partial, sum.no);
    if (sum.definer >= 0)
      fprintf(o, "%d", sum.definer);
    else
      fputs("null", o);
    fputs(", \"symbols\": [", o);
    for (unsigned k = 0; k < count; k++) {
      const kvs_elf_symbol_t *s = &r->symbols[first + k];
      fprintf(o,
              "%s\n    {\"name\": \"%s\", \"verdict\": \"%s\", \"interposable\": %s, \"reason\": ",
              k ? "," : "", kvs_elf_hook_name(s->hook), kvs_elf_verdict_name(s->verdict),
              s->verdict == KVS_ELF_YES ? "true" : "false");
      if (s->verdict == KVS_ELF_NO || s->verdict == KVS_ELF_PARTIAL) {
        jstr(o, kvs_elf_reason_name(s->reason));
        fputs(", \"reason_text\": ", o);
        jstr(o, kvs_elf_reason_text(s->reason));
      } else {
        fputs("null, \"reason_text\": null", o);
      }
      fputs(", \"defined_in\": ", o);
      if (s->definer >= 0)
        fprintf(o, "%d", s->definer);
      else
        fputs("null", o);
      fputs(", \"uses\": [", o);
      for (size_t j = 0; j < s->n_uses; j++) {
        const kvs_elf_use_t *u = &s->uses[j];
        fprintf(o, "%s{\"object\": %u, \"name\": ", j ? ", " : "", u->object);
        jstr(o, obj_name(r, u->object));
        fprintf(o, ", \"role\": \"%s\"", role_name(u->def));
        if (u->def != KVS_ELF_DEF_NONE)
          fprintf(o, ", \"visibility\": \"%s\"", vis_name(u->visibility));
        fprintf(o, ", \"jump_slot\": %u, \"glob_dat\": %u, \"other_relocs\": %u", u->jump_slot,
                u->glob_dat, u->other_relocs);
        if (u->def != KVS_ELF_DEF_NONE) {
          fputs(", \"direct_calls\": ", o);
          if (u->direct_calls >= 0)
            fprintf(o, "%d", u->direct_calls);
          else
            fputs("null", o);
          fprintf(o, ", \"pointers\": %u", u->pointers);
        }
        fprintf(o, ", \"interposable\": %s, \"reason\": ", u->interposable ? "true" : "false");
        if (u->interposable)
          fputs("null", o);
        else
          jstr(o, kvs_elf_reason_name((kvs_elf_reason_t)u->reason));
        fputc('}', o);
      }
      fputs("]}", o);
    }
    /* calls inside the defining objects that go through the PLT/GOT (issue 8) */
    fputs("],\n   \"internal_plt_calls\": [", o);
    bool firstc = true;
    for (unsigned k = 0; k < count; k++) {
      const kvs_elf_symbol_t *s = &r->symbols[first + k];
      for (size_t j = 0; j < s->n_uses; j++) {
        const kvs_elf_use_t *u = &s->uses[j];
        if (u->def == KVS_ELF_DEF_NONE || internal_relocs(u) == 0) continue;
        fprintf(o, "%s{\"symbol\": \"%s\", \"object\": %u, \"relocs\": %u, \"interposable\": %s}",
                firstc ? "" : ", ", kvs_elf_hook_name(s->hook), u->object, internal_relocs(u),
                relocs_interposable(u) ? "true" : "false");
        firstc = false;
      }
    }
    fputc(']', o);
    json_features(o, r, (kvs_elf_family_t)f);
    fputc('}', o);
  }
  fputs("],\n \"notes\": [\"objects opened with dlopen at run time (plugins) are not in the "
        "DT_NEEDED closure: inspect each plugin directly\"]}\n",
        o);
}

/* ---- command ------------------------------------------------------------------------------- */

static int usage(const char *msg, const char *arg) {
  fprintf(stderr, "kvshim inspect: ");
  fprintf(stderr, msg, arg);
  fprintf(stderr, "\nusage: kvshim inspect BINARY [--json] (kvshim help inspect)\n");
  return EXIT_USAGE;
}

int kvs_inspect_main(int argc, char **argv) {
  const char *binary = NULL;
  bool json = false;
  kvs_elf_inspect_config_t cfg = {.ld_library_path = getenv("LD_LIBRARY_PATH")};
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(kvs_inspect_help, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      json = true;
    } else if (strcmp(a, "--no-ldconfig") == 0) {
      cfg.no_ldconfig = true;
    } else if (strcmp(a, "--ld-cache") == 0) {
      if (i + 1 >= argc) return usage("--ld-cache needs a FILE%s", "");
      cfg.ld_cache = argv[++i];
    } else if (strncmp(a, "--ld-cache=", 11) == 0) {
      cfg.ld_cache = a + 11;
    } else if (a[0] == '-' && a[1] != '\0') {
      return usage("unknown option %s", a);
    } else if (binary != NULL) {
      return usage("one BINARY at a time, got also '%s'", a);
    } else {
      binary = a;
    }
  }
  if (binary == NULL) return usage("no BINARY given%s", "");
  if (secure_for_us(binary)) cfg.ld_library_path = NULL; /* ignored in secure mode */
  char err[512];
  kvs_elf_report_t *r = NULL;
  int rc = kvs_elf_inspect(binary, &cfg, &r, err, sizeof err);
  if (rc < 0) {
    fprintf(stderr, "kvshim inspect: %s\n", err[0] ? err : strerror(-rc));
    return EXIT_BAD_BINARY;
  }
  if (json) {
    print_json(stdout, binary, r);
    rc = 0;
  } else {
    rc = print_human(stdout, binary, r);
  }
  kvs_elf_report_destroy(r);
  if (rc < 0 || fflush(stdout) != 0) {
    fprintf(stderr, "kvshim inspect: %s\n", rc < 0 ? strerror(-rc) : "cannot write the report");
    return EXIT_BAD_BINARY;
  }
  return EXIT_OK;
}
