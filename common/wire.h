/* SPDX-License-Identifier: MIT */
/* Packet transport shared by daemon and library: one protobuf message per SOCK_SEQPACKET packet, fds via SCM_RIGHTS. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PB_PROTOCOL_VERSION 1
#define PB_DEFAULT_SOCKET "/run/pinbroker/pinbroker.sock"
#define PB_SOCKET_ENV "PINBROKER_SOCKET"
/*
 * Test only, "1" in both the daemon's and the client's environment: the daemon leaves pool chunks unpopulated and
 * unlocked, and the library maps leases without MAP_POPULATE, so a terabyte pool fits a small test host.
 */
#define PB_SIMULATE_ENV "PINBROKER_SIMULATE_UNBACKED"

/* Largest packet either side sends by default. A STATUS reply with a few
 * thousand leases fits; requests are tiny. The daemon's limit for what it
 * accepts is the config key max-message-bytes. */
#define PB_MAX_MSG_BYTES (1024 * 1024)

/* The kernel refuses more than SCM_MAX_FD (253) fds in one message. */
#define PB_MAX_FDS_PER_MSG 250

/*
 * Send one packet of len bytes with nfds file descriptors attached.
 * Never raises SIGPIPE. Returns 0, or a negative errno (-EAGAIN when the
 * socket is non-blocking and full, -EPIPE when the peer is gone).
 */
int wire_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds);

/*
 * Receive one packet into buf (cap bytes) and up to max_fds descriptors,
 * which arrive close-on-exec. *nfds is set to the number received.
 * Returns the packet length, 0 at end of stream, or a negative errno:
 *   -EMSGSIZE  the packet was longer than cap (it is discarded);
 *   -EBADMSG   control data was truncated (MSG_CTRUNC), more than max_fds
 *              descriptors came, or the ancillary data was not SCM_RIGHTS;
 *              any descriptors that did arrive are closed first;
 *   -EAGAIN    non-blocking socket with nothing to read.
 */
ssize_t wire_recv(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *nfds);
/* wire_recv with recvmsg flags added (MSG_DONTWAIT: -EAGAIN when nothing is queued). */
ssize_t wire_recv_flags(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *nfds, int flags);

/* Close n descriptors, ignoring -1 entries. */
void wire_close_fds(int *fds, size_t n);
