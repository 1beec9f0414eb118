/* Unit tests of core/wire/sock's stale-socket rule: a socket file whose connect is refused is
 * removed only when no live socket is bound to it (a process binds before it listens, and a
 * connect in between is refused too); anything that is not a socket is never removed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"
#include "sock.h"

static char dir[64];

static void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/kvshim-sock.XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

/* A socket bound at path and not listening, as a starting process's between bind and listen
 * (its fd is returned). */
static int bind_only(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  cr_assert_lt(strlen(path), sizeof a.sun_path);
  memcpy(a.sun_path, path, strlen(path) + 1);
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

Test(sock, a_bound_refused_socket_is_kept_until_its_process_closes_it, .timeout = 30) {
  make_dir();
  char path[128];
  snprintf(path, sizeof path, "%s/0123456789abcdef.sock", dir);
  int fd = bind_only(path);
  int cfd = -1;
  cr_assert_eq(kvs_sock_connect(path, kvs__now_ns() + 1000000000ull, &cfd), -ECONNREFUSED,
               "bound, not listening: refused");
  cr_assert_eq(kvs_sock_remove_stale(path), 0, "still bound: kept");
  struct stat st;
  cr_assert_eq(lstat(path, &st), 0, "the starting process's socket is still there");
  close(fd); /* its process is gone */
  cr_assert_eq(kvs_sock_remove_stale(path), 1, "nothing bound: removed");
  cr_assert_neq(lstat(path, &st), 0);
  rmdir(dir);
}

Test(sock, remove_stale_never_removes_what_is_not_a_socket, .timeout = 30) {
  make_dir();
  char path[128];
  snprintf(path, sizeof path, "%s/0123456789abcdef.sock", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("keep", f);
  fclose(f);
  cr_assert_eq(kvs_sock_remove_stale(path), -ENOTSOCK);
  struct stat st;
  cr_assert_eq(lstat(path, &st), 0, "a regular file is never removed");
  cr_assert_eq(st.st_size, 4);
  unlink(path);
  cr_assert_eq(kvs_sock_remove_stale(path), -ENOENT, "a missing path");
  rmdir(dir);
}
