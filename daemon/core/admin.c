/* SPDX-License-Identifier: MIT */
/* Who is an admin: the verdict from a peer's uid, groups and namespaces (admin.h). */
#include "admin.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool admin_candidate(const struct admin_facts *f)
{
	return f->root || f->in_group;
}

enum admin_verdict admin_decide(const struct admin_facts *f)
{
	if (!admin_candidate(f))
		return ADMIN_NO_RIGHTS;
	if (f->pidns == ADMIN_NS_OTHER)
		return ADMIN_OTHER_PIDNS;
	if (f->userns == ADMIN_NS_OTHER)
		return ADMIN_OTHER_USERNS;
	if (f->pidns != ADMIN_NS_SAME || f->userns != ADMIN_NS_SAME)
		return ADMIN_NS_UNREADABLE;
	return ADMIN_YES;
}

const char *admin_verdict_text(enum admin_verdict v)
{
	switch (v) {
	case ADMIN_YES:
		return "admin";
	case ADMIN_NO_RIGHTS:
		return "neither root nor in admin-group";
	case ADMIN_OTHER_PIDNS:
		return "from another pid namespace than the daemon's (a container)";
	case ADMIN_OTHER_USERNS:
		return "from another user namespace than the daemon's";
	case ADMIN_NS_UNREADABLE:
		return "its namespaces could not be read";
	}
	return "?";
}

/* The value of the line starting with key ("NSpid:"), within buf[0, len); NULL when there is none. */
static const char *line_value(const char *buf, size_t len, const char *key, const char **end)
{
	size_t klen = strlen(key);
	const char *p = buf, *stop = buf + len;

	while (p < stop) {
		const char *nl = memchr(p, '\n', (size_t)(stop - p));
		const char *eol = nl ? nl : stop;

		if ((size_t)(eol - p) >= klen && memcmp(p, key, klen) == 0) {
			*end = eol;
			return p + klen;
		}
		p = eol + 1;
	}
	return NULL;
}

int admin_parse_pidfd_fdinfo(const char *buf, size_t len, enum admin_ns *ret)
{
	const char *end, *p = line_value(buf, len, "NSpid:", &end);
	size_t levels = 0;
	long first = 0;

	if (!p)
		return -EINVAL;
	while (p < end) {
		char num[24];
		size_t n = 0;
		char *stop;
		long v;

		while (p < end && (*p == '\t' || *p == ' '))
			p++;
		while (p < end && n + 1 < sizeof(num) && *p != '\t' && *p != ' ')
			num[n++] = *p++;
		if (n == 0)
			break;
		num[n] = '\0';
		v = strtol(num, &stop, 10);
		if (*stop != '\0')
			return -EINVAL;
		if (levels++ == 0)
			first = v;
	}
	if (levels == 0)
		return -EINVAL;
	if (first < 0)
		*ret = ADMIN_NS_UNKNOWN;
	else if (first == 0 || levels > 1)
		*ret = ADMIN_NS_OTHER;
	else
		*ret = ADMIN_NS_SAME;
	return 0;
}
