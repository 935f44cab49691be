/* SPDX-License-Identifier: MIT */
/*
 * One client connection as the request modules and the socket shell both see it, and the table of what the shell does
 * with one.
 */
#pragma once

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lease.h"
#include "staged.h"
#include "pinbroker.pb-c.h"

struct broker;
struct job_cgroup;
struct outpkt;
struct server;

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
	int pidfd; /* -1 where the kernel has no pidfd_open */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	bool hello_done;
	bool admin;                /* uid 0 or member of admin-group, decided at accept */
	bool pidfd_from_peer;      /* pidfd came from SO_PEERPIDFD (not from a pid number) */
	bool closing;              /* dead: watchers stopped, freed by server_reap after the callback returns */
	bool peer_gone;            /* a send or receive found the peer gone: queued RELEASEs served at the reap */
	char name[32];             /* client_name from HELLO */
	uint32_t nleases;          /* leases it maps: held, plus attached */
	uint32_t nattached;        /* of those, attached through a share token */
	uint32_t npending;         /* waiting acquires */
	uint64_t unbrokered_bytes; /* pinned outside the broker, as its last accepted ReportUnbrokered said */
	bool unbrokered_warned;    /* an impossible report of its was logged: once per connection */
	struct job_cgroup *cgroup; /* its process's cgroup at connect, for job quotas (a reference); NULL: unknown */
	uint64_t tenant;           /* (uid, pid namespace, cgroup) at connect (core/tenant.h): a reference */
	bool job_unknown;          /* job quotas are on and that cgroup could not be read (job-unknown applies) */
	/* Status counters, kept by conn_gain/conn_lose with every lease it gains or loses (conn.c). */
	uint64_t lease_bytes;
	uint32_t rings;      /* of its held leases (not attached), staging rings */
	uint64_t ring_bytes; /* and their bytes */
	/* Its staged-copy reports (ReportStaging); since_ms 0 until the first (then its connect time). */
	struct staged_client staged;
	struct conn_label {
		char text[LEASE_LABEL_MAX];
		uint32_t leases;   /* 0: free slot */
	} labels[CONN_LABELS_MAX]; /* distinct labels of its leases; a full set lists no more */
	uint64_t connected_ms;
	ev_io io;
	ev_timer handshake;
	struct outpkt *outq_head, *outq_tail;
	size_t outq_len;
	size_t outq_bytes;
	size_t outq_fds;
	struct conn *prev, *next; /* the live list, or the dead list once closing */
};

/*
 * The socket shell's side of a connection, as the request modules (request*.c, req-*.c, reply.c,
 * revoker.c, waitq.c) reach it: through this table, never through server.h, so the broker side
 * has no include back into the shell. server.c fills it in (server_conn_io) and installs it at
 * server_new; the fuzz harness installs its own, wrapping that one.
 */
struct conn_io {
	/* server_send's contract (server.h): queued if the peer is slow; < 0 once c is closing. Never frees c. */
	int (*send)(struct conn *c, const Pinbroker__V1__Reply *reply, const int *fds, size_t nfds);
	/* server_close's: marks c closing (why at debug); it stays valid until the reap. */
	void (*close)(struct conn *c, const char *why);
	/* HELLO was accepted on c: its handshake timeout no longer applies. */
	void (*hello_done)(struct conn *c);
	/* The live connections, newest first (follow ->next; skip closing ones), and how many there are. */
	struct conn *(*first)(const struct broker *b);
	size_t (*count)(const struct broker *b);
};

/*
 * c now maps l / no longer maps l, as its holder or attached: c->nleases,
 * c->nattached and the status row's counters (bytes, labels) follow, so a
 * client row never needs a walk over the leases.
 */
void conn_gain(struct conn *c, const struct lease *l, bool attached);
void conn_lose(struct conn *c, const struct lease *l, bool attached);
