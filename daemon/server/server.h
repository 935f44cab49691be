/* SPDX-License-Identifier: MIT */
/* The socket shell: listening, accepting with peer credentials, per-connection packet I/O and limits. */
#pragma once

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conn.h"
#include "pinbroker.pb-c.h"

struct broker;

struct server;

/*
 * Test only: every accepted connection waits this many ms, on the loop's thread, before its handshake timeout
 * is set, so the loop's cached time is that much behind the clock (a long turn on a loaded host).
 */
#define SERVER_ACCEPT_STALL_ENV "PINBROKER_TEST_ACCEPT_STALL_MS"

/*
 * Listen on listen_fd (from socket activation) or, when it is -1, create the
 * socket at the configured path. Returns 0 and *ret, or a negative errno with
 * the reason already logged.
 */
int server_new(struct broker *b, int listen_fd, struct server **ret);
/* Close every connection (their leases are freed) and the listening socket. */
void server_free(struct server *s);

/* The listening fd (for the fd store / tests). */
int server_listen_fd(const struct server *s);

/*
 * Send a reply with optional fds. Packets the peer's buffer cannot take yet
 * are queued (fds dup'ed) and flushed on EV_WRITE; a peer that lets its queue
 * grow past max-queued-bytes-per-connection (or all queues past
 * max-queued-bytes) is disconnected. Never frees c. Returns 0, or a negative
 * errno when the connection is (or had to be) closed: c is then marked
 * closing, and stays valid until server_reap() frees it after the current callbacks.
 */
int server_send(struct conn *c, const Pinbroker__V1__Reply *reply, const int *fds, size_t nfds);

/*
 * Take a connected SOCK_SEQPACKET fd (non-blocking) as a client connection with
 * the given peer credentials, skipping the connection limits (accept checks them
 * first). Used by accept and by the fuzz harnesses. Takes ownership of fd.
 * Returns 0 and *ret (if ret is not NULL), or -ENOMEM with fd closed.
 */
struct ucred;
int server_adopt(struct server *s, int fd, const struct ucred *cred, struct conn **ret);

/*
 * Close a connection: logs why at debug, stops its watchers and marks it
 * closing. It is never freed here: server_reap(), run by an ev_check watcher
 * after the callbacks of the loop iteration, returns its leases, drops its
 * waiting acquires and frees it. So a handler's conn pointer stays valid
 * until the handler returns (tmux reaps dead peers the same way).
 */
void server_close(struct conn *c, const char *why);

/* Free every closed connection (their leases go back). Runs from the loop; harnesses call it directly. */
void server_reap(struct server *s);

struct conn *server_conns(const struct server *s); /* live connections; follow ->next */
size_t server_conn_count(const struct server *s);
/* The live connection with this id, or NULL (a closing one is not found). */
struct conn *server_find_conn(const struct server *s, uint64_t id);

/*
 * What the request modules do with a connection (conn.h), through server_send, server_close and
 * the live list. server_new installs it as the broker's conn_io; a harness may wrap it.
 */
extern const struct conn_io server_conn_io;

/* Send a packet to every connection (shutdown notice). */
void server_broadcast(struct server *s, const Pinbroker__V1__Reply *reply);
