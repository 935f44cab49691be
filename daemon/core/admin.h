/* SPDX-License-Identifier: MIT */
/*
 * Who is an admin: the verdict from what the shell learned of a peer (peer-ns.c). Pure: no I/O.
 *
 * Root, or a member of admin-group, is an admin only from the daemon's own user and pid namespaces. A root
 * process of a container (a pid namespace of its own, or a user namespace mapping its root to the host's uid 0)
 * is an ordinary tenant, and a peer whose namespaces cannot be read is not an admin either (fail closed).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Whether a peer's namespace is the daemon's own. */
enum admin_ns {
	ADMIN_NS_UNKNOWN, /* could not be read: no pidfd and no /proc, no ptrace access, the peer gone */
	ADMIN_NS_SAME,
	ADMIN_NS_OTHER,
};

struct admin_facts {
	bool root;     /* uid 0 as the daemon's user namespace sees it (SO_PEERCRED) */
	bool in_group; /* admin-group is its primary group or among SO_PEERGROUPS */
	enum admin_ns pidns;
	enum admin_ns userns;
};

enum admin_verdict {
	ADMIN_YES,
	ADMIN_NO_RIGHTS,     /* neither root nor in admin-group: an ordinary tenant, nothing to say */
	ADMIN_OTHER_PIDNS,   /* root or group, but from another pid namespace: a container */
	ADMIN_OTHER_USERNS,  /* root or group, but from another user namespace */
	ADMIN_NS_UNREADABLE, /* root or group, namespaces unknown: refused, and the log says why */
};

/* Whether the peer needs its namespaces read at all: only root and admin-group members do. */
bool admin_candidate(const struct admin_facts *f);

/* The verdict on f. Another namespace wins over an unknown one, so a container is named as such. */
enum admin_verdict admin_decide(const struct admin_facts *f);

/* A short phrase for a verdict, for the log ("from another pid namespace"). */
const char *admin_verdict_text(enum admin_verdict v);

/*
 * A pidfd's fdinfo (/proc/self/fdinfo/FD of a pidfd): where its process sits relative to the pid namespace of
 * the procfs it was read through. The kernel writes "Pid:\tN" (0: outside that namespace's tree, -1: the
 * process is gone) and "NSpid:\tN[\tM...]", one number per level from that namespace down to the process's own.
 * Sets *ret to ADMIN_NS_SAME (one level, N > 0), ADMIN_NS_OTHER (N == 0, or more levels) or ADMIN_NS_UNKNOWN
 * (gone). Returns 0, or -EINVAL when buf has no NSpid line (a kernel without it: read /proc/PID/ns instead).
 */
int admin_parse_pidfd_fdinfo(const char *buf, size_t len, enum admin_ns *ret);
