/* tests/lib: passing one fd with a message over a Unix socket (SCM_RIGHTS), for the tests that
 * hand a pool to another process. */
#ifndef KVSHIM_TESTS_FDPASS_H
#define KVSHIM_TESTS_FDPASS_H

#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Sends len bytes of data (len >= 1) with fd. 0, or -1. */
static inline int send_fd(int sock, int fd, const void *data, size_t len) {
  struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                      .msg_controllen = sizeof u.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &mh, 0) == (ssize_t)len ? 0 : -1;
}

/* Receives one message of at most cap bytes into data (*len: its size) and its fd (*fd,
 * close-on-exec). 0, or -1 when nothing or no fd came. */
static inline int recv_fd(int sock, int *fd, void *data, size_t cap, size_t *len) {
  struct iovec iov = {.iov_base = data, .iov_len = cap};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                      .msg_controllen = sizeof u.buf};
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  if (n <= 0) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) return -1;
  memcpy(fd, CMSG_DATA(c), sizeof *fd);
  *len = (size_t)n;
  return 0;
}

#endif
