/* SPDX-License-Identifier: MIT */
/*
 * What the request fixture (lib/reqfix.c) and the fuzzers (fuzz/harness.c) share of the daemon they build in memory:
 * its config, and a test client's connection to it on a socket pair (whether the daemon still has it, a fresh one).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "daemon.h"
#include "jobs.h"
#include "server.h"

/*
 * The config lines of the small broker both build (each adds its socket): a 2 MiB budget, 1536 KiB per uid,
 * 16 KiB chunks, a 512 KiB warm pool of unlocked memfds, 16 leases per client, short timeouts.
 */
#define CONNFIX_CONFIG                                                                                                 \
	"budget=2M", "uid-quota=1536K", "prewarm=512K", "chunk-size=16K", "hugetlb=no", "lock-memory=no",              \
		"pool-shrink-delay-ms=0", "acquire-timeout-ms=2", "revoke-deadline-ms=2", "revoke-enforce=disconnect", \
		"max-leases-per-client=16", "max-pending-acquires=4", "log-level=err"

/* Whether the daemon still has *conn (found by id first: a conn that is gone may already be freed); NULLs it if not. */
static inline bool connfix_alive(const struct daemon *d, struct conn **conn, uint64_t id)
{
	struct conn *c;

	if (!*conn)
		return false;
	c = server_find_conn(d->server, id);
	if (!c || c->closing)
		*conn = NULL;
	return *conn != NULL;
}

/*
 * Replace *conn (closed as why says) and our end *peer with a fresh pair: the daemon adopts its end as cred's,
 * charged to cgroup where it knows no cgroup of its own and has jobs. NULL, or what failed.
 */
static inline const char *connfix_open(struct daemon *d, const struct ucred *cred, const char *cgroup, const char *why,
				       struct conn **conn, int *peer)
{
	int sv[2];

	if (*conn)
		server_close(*conn, why);
	*conn = NULL;
	if (*peer >= 0)
		close(*peer);
	*peer = -1;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
		return "socketpair";
	*peer = sv[0];
	if (server_adopt(d->server, sv[1], cred, conn) != 0)
		return "server_adopt";
	if (!(*conn)->cgroup && d->broker.jobs) {
		if (jobs_cgroup_get(d->broker.jobs, cgroup, &(*conn)->cgroup) != 0)
			return "jobs_cgroup_get";
		/* Its job is known now: job-unknown must not refuse it. */
		d->broker.job_unknown_clients -= (*conn)->job_unknown;
		(*conn)->job_unknown = false;
	}
	return NULL;
}
