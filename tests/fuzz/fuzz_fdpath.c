/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: packets carrying unexpected, extra or wrong-type fds through the daemon's receive path, checked for fd leaks. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

/*
 * Input: one flags byte (bit i: connection i is uid 0; bit 2: the many-leases
 * profile, see harness.h), then operations:
 *   op & 7 in 0..2  send a packet from connection (op >> 3) & 1's peer into the
 *                   daemon's socket, then run the loop (wire_recv + dispatch):
 *                   an fd byte F: F & 0x3f fds (capped at 253, the kernel's
 *                   SCM_MAX_FD), F & 0x40 adds an SCM_CREDENTIALS message; one
 *                   kind byte per fd (kind % 8: memfd, pipe read end, pipe write
 *                   end, socket, /dev/null, eventfd, the peer socket itself,
 *                   a sealed memfd); then a length byte (bit 7: a second byte,
 *                   15 bits) and that many payload bytes, repeated to fill L;
 *   3               requests in bulk from connection (op >> 3) & 1's peer,
 *                   each sent into the daemon's socket and read by its loop
 *                   (fz_bulk_op in harness.h);
 *   4               drain both peers;
 *   5               pressure state (op >> 3) % 3;
 *   6               run the loop once (3 ms of clock first with op & 8);
 *   7               close our end of connection (op >> 3) & 1.
 * After each input every fd the harness or the daemon opened must be closed.
 */

#define FD_KINDS 8

static int make_fd(struct fz *f, int i, unsigned kind, int *extra)
{
	int pfd[2], fd = -1;

	*extra = -1;
	switch (kind % FD_KINDS) {
	case 0:
		fd = memfd_create("fuzz", MFD_CLOEXEC);
		break;
	case 1:
	case 2:
		if (pipe2(pfd, O_CLOEXEC) < 0)
			return -1;
		fd = kind % FD_KINDS == 1 ? pfd[0] : pfd[1];
		*extra = kind % FD_KINDS == 1 ? pfd[1] : pfd[0];
		break;
	case 3:
		fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		break;
	case 4:
		fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		break;
	case 5:
		fd = eventfd(0, EFD_CLOEXEC);
		break;
	case 6:
		fd = fcntl(f->peer[i], F_DUPFD_CLOEXEC, 3);
		break;
	case 7:
		fd = memfd_create("fuzz-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd >= 0 && (ftruncate(fd, 4096) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK) < 0)) {
			close(fd);
			fd = -1;
		}
		break;
	}
	return fd;
}

static void send_packet(struct fz *f, int i, const uint8_t *payload, size_t plen, size_t len, const int *fds,
			size_t nfds, bool creds)
{
	static uint8_t buf[1 << 15];
	union {
		char buf[CMSG_SPACE(sizeof(int) * 253) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;
	size_t clen = 0;

	for (size_t k = 0; k < len; k++)
		buf[k] = plen ? payload[k % plen] : 0;
	memset(&control, 0, sizeof(control));
	if (nfds > 0)
		clen += CMSG_SPACE(sizeof(int) * nfds);
	if (creds)
		clen += CMSG_SPACE(sizeof(struct ucred));
	if (clen) {
		msg.msg_control = control.buf;
		msg.msg_controllen = clen;
		cm = CMSG_FIRSTHDR(&msg);
		if (nfds > 0) {
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
			cm = CMSG_NXTHDR(&msg, cm);
		}
		if (creds) {
			struct ucred uc = { .pid = getpid(), .uid = getuid(), .gid = getgid() };

			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_CREDENTIALS;
			cm->cmsg_len = CMSG_LEN(sizeof(uc));
			memcpy(CMSG_DATA(cm), &uc, sizeof(uc));
		}
	}
	/* EAGAIN (daemon not reading), EPIPE (it closed): both are the daemon's right. */
	(void)sendmsg(f->peer[i], &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* A bulk op's request, through the socket and the daemon's own receive path. */
static void send_plain(struct fz *f, int i, const uint8_t *pkt, size_t len)
{
	fz_conn(f, i);
	send_packet(f, i, pkt, len, len, NULL, 0, false);
	fz_run_loop(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const char *const overrides[] = { "max-message-bytes=1024", NULL };

	fz_global_init(overrides);
	return 0;
}

/*
 * Ops 0-2: one packet with fds: a byte with the fd count (low 6 bits) and whether to send credentials (0x40), a kind
 * byte per fd, a length byte (two with its top bit set), then the packet's bytes.
 */
static void fd_packet_op(struct fz *f, uint8_t op, int i, const uint8_t **p, const uint8_t *end)
{
	int fds[253], extras[253];
	size_t nfds = 0, len, plen;
	bool creds;
	uint8_t fb;

	(void)op;
	if (*p >= end)
		return;
	fb = *(*p)++;
	creds = fb & 0x40;
	fz_conn(f, i);
	for (size_t k = 0; k < (size_t)(fb & 0x3f) && k < 253; k++) {
		unsigned kind = *p < end ? *(*p)++ : 0;
		int fd = make_fd(f, i, kind, &extras[nfds]);

		if (fd >= 0)
			fds[nfds++] = fd;
	}
	len = *p < end ? *(*p)++ : 0;
	if ((len & 0x80) && *p < end)
		len = ((len & 0x7f) << 8) | *(*p)++;
	plen = (size_t)(end - *p) < (len & 0x7fff) ? (size_t)(end - *p) : (len & 0x7fff);
	send_packet(f, i, *p, plen, len & 0x7fff, fds, nfds, creds);
	*p += plen;
	for (size_t k = 0; k < nfds; k++) {
		close(fds[k]);
		if (extras[k] >= 0)
			close(extras[k]);
	}
	fz_run_loop(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return fz_run_input(data, size, fd_packet_op, send_plain);
}
