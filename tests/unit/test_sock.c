/* Unit tests of core/sock's listen: the socket file appears only once it listens (a file that
 * refuses connections is stale, as discovery assumes), and an existing file is refused with
 * nothing changed and nothing left behind. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "sock.h"

static char dir[64];

static void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/kvshim-sock.XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

/* Entries of dir other than . and .. */
static int entries(void) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

Test(sock, listen_publishes_a_listening_0600_socket_and_leaves_no_sibling, .timeout = 30) {
  make_dir();
  char path[128];
  snprintf(path, sizeof path, "%s/0123456789abcdef.sock", dir);
  int lfd = -1;
  cr_assert_eq(kvs_sock_listen(path, 4, &lfd), 0);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert(S_ISSOCK(st.st_mode), "a socket at the path");
  cr_assert_eq(st.st_mode & 0777, 0600);
  cr_assert_eq(entries(), 1, "the bind-time sibling is gone");
  int cfd = -1;
  cr_assert_eq(kvs_sock_connect(path, kvs__now_ns() + 2000000000ull, &cfd), 0,
               "the published path accepts connections at once");
  close(cfd);
  close(lfd);
  unlink(path);
  rmdir(dir);
}

Test(sock, listen_on_an_existing_path_is_refused_and_changes_nothing, .timeout = 30) {
  make_dir();
  char path[128];
  snprintf(path, sizeof path, "%s/0123456789abcdef.sock", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("keep", f);
  fclose(f);
  int lfd = -7;
  cr_assert_eq(kvs_sock_listen(path, 4, &lfd), -EEXIST);
  cr_assert_eq(lfd, -7, "out-parameter untouched on failure");
  char b[8] = {0};
  f = fopen(path, "r");
  cr_assert_not_null(f);
  cr_assert_eq(fread(b, 1, sizeof b - 1, f), 4);
  fclose(f);
  cr_assert_str_eq(b, "keep", "the existing file is intact");
  cr_assert_eq(entries(), 1, "no sibling left behind");
  /* a path ending in '~' uses another sibling name, and too long a path is refused */
  char tilde[128];
  snprintf(tilde, sizeof tilde, "%s/x~", dir);
  cr_assert_eq(kvs_sock_listen(tilde, 4, &lfd), 0);
  cr_assert_eq(entries(), 2);
  close(lfd);
  unlink(tilde);
  char longp[KVS_SOCK_PATH_MAX + 16];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  cr_assert_eq(kvs_sock_listen(longp, 4, &lfd), -ENAMETOOLONG);
  unlink(path);
  rmdir(dir);
}
