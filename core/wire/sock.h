/* kvshim sock: the thin layer over Unix stream sockets, SCM_RIGHTS, peer credentials and the
 * private run directory. Every function returns 0 (or a count) or a negative errno.
 *
 * Deadlines are absolute CLOCK_MONOTONIC nanoseconds (kvs__now_ns() + budget); 0 = none. The
 * blocking helpers work on blocking and non-blocking fds alike (they poll on EAGAIN). */
#ifndef KVSHIM_SOCK_H
#define KVSHIM_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Longest socket path (sun_path less the NUL). */
#define KVS_SOCK_PATH_MAX 107

/* Create every missing directory of path with mode 0700, then check the last one: it must be
 * a directory owned by us and not accessible to group or others (-EPERM otherwise, with a log
 * line saying why). */
int kvs_dir_ensure_private(const char *path);

/* Bind and listen on path (which must not exist: the caller removes stale sockets). The socket
 * is non-blocking and close-on-exec; the file is made 0600. *out_fd owned by the caller. */
int kvs_sock_listen(const char *path, int backlog, int *out_fd);
/* Accept one connection (non-blocking, close-on-exec). -EAGAIN when none is pending. */
int kvs_sock_accept(int listen_fd, int *out_fd);
/* Connect to path within the deadline. -ECONNREFUSED / -ENOENT: nobody listens there (stale);
 * -ETIMEDOUT. The returned fd is non-blocking and close-on-exec. */
int kvs_sock_connect(const char *path, uint64_t deadline_ns, int *out_fd);

/* Remove path, a socket file whose connect was just refused, unless a live socket is still
 * bound to it: a process binds its socket file before it listens (kvs_sock_listen), and a
 * connect in between is refused too. Bound sockets are those the kernel lists in /proc/net/unix
 * (of this network namespace); when that cannot be read the file is removed. Returns 1 when
 * removed (logged), 0 when kept (bound: its process may be about to listen), -ENOTSOCK (not a
 * socket: never removed), or the errno of lstat/unlink. */
int kvs_sock_remove_stale(const char *path);

/* SO_PEERCRED of a connected socket. */
int kvs_sock_peer_cred(int fd, uid_t *uid, pid_t *pid);

/* Send every byte of iov (modified in place) before the deadline, as few sendmsg calls as the
 * socket allows. When pass_fd >= 0 it travels with the first byte (SCM_RIGHTS).
 * -EPIPE/-ECONNRESET when the peer went away. */
int kvs_sock_send_all(int fd, struct iovec *iov, int iovcnt, int pass_fd, uint64_t deadline_ns);
/* Receive exactly len bytes before the deadline. When fd_out is not NULL, a descriptor that
 * arrives with these bytes is stored there (close-on-exec; -1 when none arrived; the caller owns
 * it); descriptors arriving when fd_out is NULL are closed. -ECONNRESET when the peer closed
 * before len bytes. */
int kvs_sock_recv_all(int fd, void *buf, size_t len, int *fd_out, uint64_t deadline_ns);

/* Non-blocking receive of what is available (up to len), collecting a passed fd like
 * kvs_sock_recv_all. Returns bytes read (> 0), -EAGAIN, or -ECONNRESET on orderly close. */
ssize_t kvs_sock_recv_some(int fd, void *buf, size_t len, int *fd_out);
/* Non-blocking send of what fits. Returns bytes sent (>= 0) or a negative errno (not EAGAIN:
 * that returns 0). pass_fd as in kvs_sock_send_all (sent only if at least one byte goes). */
ssize_t kvs_sock_send_some(int fd, const void *buf, size_t len, int pass_fd);
/* The same for a vector (one sendmsg; at most IOV_MAX entries are looked at). */
ssize_t kvs_sock_sendv_some(int fd, const struct iovec *iov, int iovcnt, int pass_fd);
/* Wait until fd has events (POLLIN, POLLOUT) or an error, before the deadline: 0 or
 * -ETIMEDOUT (or the errno of poll). */
int kvs_sock_wait(int fd, short events, uint64_t deadline_ns);

#ifdef __cplusplus
}
#endif
#endif
