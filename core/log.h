/* kvshim log: levelled, prefixed, rate-limited and allocation-free.
 *
 * A line is "kvshim[pid]: level: message\n", formatted into a stack buffer and written with a
 * single write(2) to the log fd (stderr unless KVSHIM_LOG_FILE names a file). The level is
 * checked before anything is formatted, so a disabled level costs one load and one compare.
 * At most KVS_LOG_BURST lines are written per second; the rest are counted and reported in
 * the next line that gets through. Never used on a success hot path. */
#ifndef KVSHIM_LOG_H
#define KVSHIM_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvs_log_level {
  KVS_LOG_OFF = 0,
  KVS_LOG_ERROR = 1,
  KVS_LOG_WARN = 2,
  KVS_LOG_INFO = 3,
  KVS_LOG_DEBUG = 4,
  KVS_LOG_TRACE = 5,
} kvs_log_level_t;

#define KVS_LOG_BURST 64   /* lines per second before rate limiting */
#define KVS_LOG_LINE_MAX 1024 /* bytes; longer messages are cut and end in "..." */

/* Current level (read with relaxed ordering; written once at init and by tests). */
extern int kvs__log_level;

void kvs_log_set_level(kvs_log_level_t level);
kvs_log_level_t kvs_log_get_level(void);
/* Redirect output. The fd is borrowed: the caller keeps it open while it is in use. */
void kvs_log_set_fd(int fd);
int kvs_log_get_fd(void);
/* Lines dropped by rate limiting since start. */
unsigned long kvs_log_dropped(void);
const char *kvs_log_level_name(kvs_log_level_t level);

void kvs__log(kvs_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvs__vlog(kvs_log_level_t level, const char *fmt, va_list ap);

#define KVS_LOG(level, ...)                                                                   \
  do {                                                                                        \
    if (__builtin_expect((int)(level) <= kvs__log_level, 0)) kvs__log((level), __VA_ARGS__);  \
  } while (0)
#define kvs_log_error(...) KVS_LOG(KVS_LOG_ERROR, __VA_ARGS__)
#define kvs_log_warn(...)  KVS_LOG(KVS_LOG_WARN, __VA_ARGS__)
#define kvs_log_info(...)  KVS_LOG(KVS_LOG_INFO, __VA_ARGS__)
#define kvs_log_debug(...) KVS_LOG(KVS_LOG_DEBUG, __VA_ARGS__)
#define kvs_log_trace(...) KVS_LOG(KVS_LOG_TRACE, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
