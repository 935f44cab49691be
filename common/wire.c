/* SPDX-License-Identifier: MIT */
/* Packet transport: SOCK_SEQPACKET send/recv with SCM_RIGHTS, shared by pinbrokerd and libpinbroker. */
#include "wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int wire_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int) * PB_MAX_FDS_PER_MSG)];
		struct cmsghdr align;
	} control;
	ssize_t n;

	if (nfds > PB_MAX_FDS_PER_MSG)
		return -E2BIG;
	if (nfds > 0) {
		struct cmsghdr *cmsg;

		memset(&control, 0, sizeof(control));
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cmsg = CMSG_FIRSTHDR(&msg);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * nfds);
	}
	do {
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if ((size_t)n != len)
		return -EMSGSIZE; /* cannot happen on SEQPACKET, but never report a partial packet as sent */
	return 0;
}

void wire_close_fds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
}

ssize_t wire_recv(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *nfds)
{
	return wire_recv_flags(sock, buf, cap, fds, max_fds, nfds, 0);
}

ssize_t wire_recv_flags(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *nfds, int flags)
{
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	union {
		char buf[CMSG_SPACE(sizeof(int) * PB_MAX_FDS_PER_MSG)];
		struct cmsghdr align;
	} control;
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control.buf,
		.msg_controllen = sizeof(control.buf),
	};
	int received[PB_MAX_FDS_PER_MSG];
	size_t nreceived = 0;
	int bad = 0;
	ssize_t n;

	*nfds = 0;
	do {
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			for (size_t i = 0; i < k; i++) {
				int fd;

				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				if (nreceived < PB_MAX_FDS_PER_MSG)
					received[nreceived++] = fd;
				else
					close(fd);
			}
		} else {
			bad = 1; /* SCM_CREDENTIALS or anything else we never asked for */
		}
	}

	if ((msg.msg_flags & MSG_CTRUNC) || bad || nreceived > max_fds) {
		wire_close_fds(received, nreceived);
		return -EBADMSG;
	}
	if (msg.msg_flags & MSG_TRUNC) {
		wire_close_fds(received, nreceived);
		return -EMSGSIZE;
	}
	/* An empty packet with fds (a hang-up carries none): malformed, not an end of stream that leaks them. */
	if (n == 0 && nreceived > 0) {
		wire_close_fds(received, nreceived);
		return -EBADMSG;
	}
	if (nreceived > 0)
		memcpy(fds, received, nreceived * sizeof(int));
	*nfds = nreceived;
	return n;
}
