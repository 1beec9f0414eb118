/* kvshim sock: see sock.h. */
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"

int kvs_dir_ensure_private(const char *path) {
  char buf[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return -ENAMETOOLONG;
  memcpy(buf, path, n + 1);
  for (char *p = buf + 1; *p; p++) { /* every parent, then the leaf */
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0700) < 0 && errno != EEXIST) return -errno;
    *p = '/';
  }
  if (mkdir(buf, 0700) < 0 && errno != EEXIST) return -errno;
  struct stat st;
  if (lstat(buf, &st) < 0) return -errno;
  if (!S_ISDIR(st.st_mode)) {
    kvs_log_error("%s is not a directory", path);
    return -ENOTDIR;
  }
  if (st.st_uid != geteuid()) {
    kvs_log_error("run directory %s belongs to uid %u, not to us (%u): refusing it", path,
                  (unsigned)st.st_uid, (unsigned)geteuid());
    return -EPERM;
  }
  if (st.st_mode & 077) {
    /* We own it: tighten rather than refuse (an umask or a careless mkdir made it). */
    if (chmod(buf, 0700) < 0) {
      kvs_log_error("run directory %s is mode %03o and cannot be made 0700", path,
                    (unsigned)(st.st_mode & 0777));
      return -EPERM;
    }
  }
  return 0;
}

static int fill_addr(struct sockaddr_un *a, const char *path) {
  size_t n = strlen(path);
  if (n == 0 || n > KVS_SOCK_PATH_MAX) return -ENAMETOOLONG;
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  memcpy(a->sun_path, path, n);
  return 0;
}

int kvs_sock_listen(const char *path, int backlog, int *out_fd) {
  struct sockaddr_un a;
  KVS_TRY(fill_addr(&a, path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || chmod(path, 0600) < 0 ||
      listen(fd, backlog) < 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  *out_fd = fd;
  return 0;
}

/* Is a socket bound to path in /proc/net/unix? Each line ends with the bound path, after a
 * space. -errno when the table cannot be read. */
static int bound_in_proc(const char *path) {
  FILE *f = fopen("/proc/net/unix", "re");
  if (!f) return -errno;
  size_t n = strlen(path);
  char line[512];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    size_t k = strcspn(line, "\n");
    if (!line[k] && !feof(f)) { /* a line longer than the buffer: skip the rest of it */
      int c;
      while ((c = fgetc(f)) != EOF && c != '\n') {
      }
      continue;
    }
    found = k > n && line[k - n - 1] == ' ' && memcmp(line + k - n, path, n) == 0;
  }
  fclose(f);
  return found;
}

int kvs_sock_remove_stale(const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0) return -errno;
  if (!S_ISSOCK(st.st_mode)) return -ENOTSOCK;
  if (bound_in_proc(path) == 1) return 0;
  if (unlink(path) < 0) return -errno;
  kvs_log_info("removed stale socket %s", path);
  return 1;
}

int kvs_sock_accept(int listen_fd, int *out_fd) {
  int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  *out_fd = fd;
  return 0;
}

/* Wait for events on fd until the deadline: 0 when ready, -ETIMEDOUT, or -errno. */
static int wait_fd(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    int timeout = -1;
    if (deadline_ns) {
      uint64_t now = kvs__now_ns();
      if (now >= deadline_ns) return -ETIMEDOUT;
      uint64_t ms = (deadline_ns - now + 999999) / 1000000;
      timeout = ms > 1000000 ? 1000000 : (int)ms;
    }
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, timeout);
    if (r > 0) return 0; /* readable, writable, or an error the next call reports */
    if (r == 0) continue;  /* the loop re-checks the deadline */
    if (errno != EINTR) return -errno;
  }
}

int kvs_sock_connect(const char *path, uint64_t deadline_ns, int *out_fd) {
  struct sockaddr_un a;
  KVS_TRY(fill_addr(&a, path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    if (e == EAGAIN || e == EINPROGRESS) {
      /* Backlog full: Unix sockets do not complete asynchronously, so retry until the deadline. */
      for (;;) {
        int w = wait_fd(fd, POLLOUT, deadline_ns ? deadline_ns : kvs__now_ns() + 1000000000ull);
        if (w < 0) {
          close(fd);
          return w;
        }
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 || errno == EISCONN) break;
        if (errno != EAGAIN && errno != EINPROGRESS && errno != EALREADY) {
          e = errno;
          close(fd);
          return -e;
        }
      }
    } else {
      close(fd);
      return -e;
    }
  }
  *out_fd = fd;
  return 0;
}

int kvs_sock_peer_cred(int fd, uid_t *uid, pid_t *pid) {
  struct ucred c;
  socklen_t len = sizeof c;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) < 0) return -errno;
  if (uid) *uid = c.uid;
  if (pid) *pid = c.pid;
  return 0;
}

/* Collect (or close) descriptors from a received control message. */
static void take_fds(struct msghdr *m, int *fd_out) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int fds[8];
    if (nfd > KVS__ARRAY_LEN(fds)) nfd = KVS__ARRAY_LEN(fds);
    memcpy(fds, CMSG_DATA(c), nfd * sizeof(int));
    for (size_t i = 0; i < nfd; i++) {
      if (fd_out && *fd_out < 0) *fd_out = fds[i];
      else close(fds[i]); /* unexpected or surplus: never leak */
    }
  }
}

ssize_t kvs_sock_recv_some(int fd, void *buf, size_t len, int *fd_out) {
  union {
    char buf[CMSG_SPACE(8 * sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {buf, len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                     .msg_controllen = sizeof ctl.buf};
  for (;;) {
    ssize_t r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r > 0) {
      take_fds(&m, fd_out);
      return r;
    }
    if (r == 0) return -ECONNRESET;
    if (errno == EINTR) continue;
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
}

ssize_t kvs_sock_sendv_some(int fd, const struct iovec *iov, int iovcnt, int pass_fd) {
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct msghdr m = {.msg_iov = (struct iovec *)iov,
                     .msg_iovlen = (size_t)(iovcnt < IOV_MAX ? iovcnt : IOV_MAX)};
  if (pass_fd >= 0) {
    memset(&ctl, 0, sizeof ctl);
    m.msg_control = ctl.buf;
    m.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  for (;;) {
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

ssize_t kvs_sock_send_some(int fd, const void *buf, size_t len, int pass_fd) {
  struct iovec iov = {(void *)buf, len};
  return kvs_sock_sendv_some(fd, &iov, 1, pass_fd);
}

int kvs_sock_wait(int fd, short events, uint64_t deadline_ns) {
  return wait_fd(fd, events, deadline_ns);
}

int kvs_sock_send_all(int fd, struct iovec *iov, int iovcnt, int pass_fd, uint64_t deadline_ns) {
  /* One sendmsg for as much of the vector as the socket takes: a header and its payload leave
   * together (one syscall, and the receiver wakes once). */
  for (;;) {
    while (iovcnt > 0 && iov->iov_len == 0) iov++, iovcnt--;
    if (iovcnt == 0) return 0;
    ssize_t r = kvs_sock_sendv_some(fd, iov, iovcnt, pass_fd);
    if (r < 0) return (int)r;
    if (r == 0) {
      KVS_TRY(wait_fd(fd, POLLOUT, deadline_ns));
      continue;
    }
    pass_fd = -1; /* travelled with the first byte */
    for (size_t left = (size_t)r; left > 0;) {
      size_t n = left < iov->iov_len ? left : iov->iov_len;
      iov->iov_base = (char *)iov->iov_base + n;
      iov->iov_len -= n;
      left -= n;
      if (iov->iov_len == 0) iov++, iovcnt--;
    }
  }
}

int kvs_sock_recv_all(int fd, void *buf, size_t len, int *fd_out, uint64_t deadline_ns) {
  if (fd_out) *fd_out = -1;
  size_t got = 0;
  while (got < len) {
    ssize_t r = kvs_sock_recv_some(fd, (char *)buf + got, len - got, fd_out);
    if (r == -EAGAIN) {
      int w = wait_fd(fd, POLLIN, deadline_ns);
      if (w < 0) {
        if (fd_out && *fd_out >= 0) close(*fd_out), *fd_out = -1;
        return w;
      }
      continue;
    }
    if (r < 0) {
      if (fd_out && *fd_out >= 0) close(*fd_out), *fd_out = -1;
      return (int)r;
    }
    got += (size_t)r;
  }
  return 0;
}
