/* kvshim redis: see redis.h. Skeleton: URL parsing and key slots are real; the connection
 * functions answer -ENOSYS until the client lands (same branch). */
#include "redis.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis.h>

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

int kvs_redis_url_parse(const char *url, kvs_redis_url_t *out, char *err, size_t errlen) {
  (void)url; (void)out;
  seterr(err, errlen, "redis URL parser not built yet");
  return -EINVAL;
}

int kvs_redis_create(const kvs_redis_config_t *cfg, kvs_redis_t **out, char *err, size_t errlen) {
  (void)cfg; (void)out;
  seterr(err, errlen, "redis client not built yet");
  return -ENOSYS;
}

void kvs_redis_destroy(kvs_redis_t *r) { (void)r; }

int kvs_redis_exec(kvs_redis_t *r, const kvs_redis_cmd_t *cmds, size_t n,
                   kvs_redis_result_t *results) {
  (void)r; (void)cmds; (void)n; (void)results;
  return -ENOSYS;
}

void kvs_redis_results_release(kvs_redis_t *r) { (void)r; }

int kvs_redis_info(kvs_redis_t *r, kvs_redis_info_t *out) {
  (void)r; (void)out;
  return -ENOSYS;
}

/* CRC16-CCITT (XMODEM: poly 0x1021, init 0), as Redis Cluster's crc16.c defines it. */
static uint16_t crc16(const unsigned char *p, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; i++) {
    crc ^= (uint16_t)(p[i] << 8);
    for (int b = 0; b < 8; b++) crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

/* Redis Cluster spec, "Hash tags": hash only what lies between the first '{' and the first
 * '}' after it, when that is not empty. */
unsigned kvs_redis_key_slot(const char *key, size_t len) {
  const unsigned char *k = (const unsigned char *)key;
  const unsigned char *open = memchr(k, '{', len);
  if (open) {
    size_t s = (size_t)(open - k) + 1;
    const unsigned char *close = memchr(k + s, '}', len - s);
    if (close && close > k + s) return crc16(k + s, (size_t)(close - (k + s))) & 16383u;
  }
  return crc16(k, len) & 16383u;
}
