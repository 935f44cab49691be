/* SPDX-License-Identifier: MIT */
/* The socket shell: listening, accepting with peer credentials, per-connection packet I/O and limits. */
#pragma once

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lease.h"
#include "pinbroker.pb-c.h"

struct broker;
struct outpkt;

/* Distinct lease labels listed on a connection's status row: a few, so the row stays small. */
#define CONN_LABELS_MAX 4

/*
 * One client connection. Lifetime: server_adopt() puts it on the live list; server_close() stops
 * its watchers and moves it to the dead list (closing); server_reap() frees it once the loop
 * iteration's callbacks are done. A pointer held by a handler stays valid until then.
 */
struct conn {
	struct server *srv;
	struct broker *broker;
	uint64_t id;
	int fd;
	int pidfd;            /* -1 where the kernel has no pidfd_open */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	bool hello_done;
	bool admin;           /* uid 0 or member of admin-group, decided at accept */
	bool pidfd_from_peer; /* pidfd came from SO_PEERPIDFD (not from a pid number) */
	bool closing;         /* dead: watchers stopped, freed by server_reap after the callback returns */
	char name[32];        /* client_name from HELLO */
	uint32_t nleases;     /* leases it maps: held, plus attached */
	uint32_t nattached;   /* of those, attached through a share token */
	uint32_t npending;    /* waiting acquires */
	uint64_t unbrokered_bytes; /* pinned outside the broker, as its last ReportUnbrokered said */
	/* Status counters, kept by status_conn_add/remove with every lease it gains or loses (req-status.c). */
	uint64_t lease_bytes;
	struct conn_label {
		char text[LEASE_LABEL_MAX];
		uint32_t leases;      /* 0: free slot */
	} labels[CONN_LABELS_MAX]; /* distinct labels of its leases; a full set lists no more */
	uint64_t connected_ms;
	ev_io io;
	ev_timer handshake;
	struct outpkt *outq_head, *outq_tail;
	size_t outq_len;
	size_t outq_bytes;
	size_t outq_fds;
	struct conn *prev, *next;  /* the live list, or the dead list once closing */
};

struct server;

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

struct conn *server_conns(const struct server *s);   /* live connections; follow ->next */
size_t server_conn_count(const struct server *s);
/* The live connection with this id, or NULL (a closing one is not found). */
struct conn *server_find_conn(const struct server *s, uint64_t id);

/* Send a packet to every connection (shutdown notice). */
void server_broadcast(struct server *s, const Pinbroker__V1__Reply *reply);
