/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker's registrations: the caller's own memory charged (pb_register), memory the driver owns charged by
 * its size (register_charge_bytes), unbrokered pinning reported.
 */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/*
 * What backs the pages [first, end) when they are a shared file mapping: a /dev/shm file, a memfd, any
 * MAP_SHARED file. The daemon charges registrations of one file by the union of their page ranges, so the
 * ranks of a server that all register one region are charged once. From /proc/self/maps: every VMA over
 * the span must map the same file (device, inode) shared, back to back in the address space and in the
 * file. Returns true and fills *out; false for anything else (private or anonymous memory, a hole, two
 * files, maps unreadable): the registration is then charged in full, as before.
 */
static bool reg_backing(uintptr_t first, uintptr_t end, Pinbroker__V1__Backing *out)
{
	FILE *f = fopen("/proc/self/maps", "re");
	uintptr_t cur = first;
	char *line = NULL;
	size_t cap = 0;
	bool ok = false;

	if (!f)
		return false;
	while (cur < end && getline(&line, &cap, f) > 0) {
		uintptr_t vstart, vend;
		unsigned long long off, ino;
		unsigned maj, min;
		char perms[5];
		uint64_t at;

		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %llx %x:%x %llu", &vstart, &vend, perms, &off, &maj,
			   &min, &ino) != 7)
			break;
		if (vend <= cur)
			continue;
		/* A hole, private (copy-on-write) or anonymous memory: nothing shared backs it. */
		if (vstart > cur || perms[3] != 's' || ino == 0)
			break;
		at = off + (cur - vstart);
		if (cur == first) {
			out->dev = makedev(maj, min);
			out->ino = ino;
			out->offset = at;
		} else if (out->dev != makedev(maj, min) || out->ino != ino || at != out->offset + (cur - first)) {
			break; /* another file, or the same file's pages out of order */
		}
		cur = vend < end ? vend : end;
		ok = cur >= end;
	}
	free(line);
	fclose(f);
	return ok;
}

int pb_register(pb_client *c, void *p, size_t size, const struct pb_acquire_opts *opts, pb_lease **ret)
{
	Pinbroker__V1__Backing backing = PINBROKER__V1__BACKING__INIT;
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint32_t flags = opts ? opts->flags : 0;
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), first, end;
	struct reg_span reg = { p, size };
	int r;

	if (!ret)
		return err_set(-EINVAL, "pb_register: ret is NULL");
	*ret = NULL;
	if (!c)
		return err_set(-ENOTCONN, "not connected to a broker");
	if (!p || size == 0)
		return err_set(-EINVAL, "cannot register %s", p ? "0 bytes" : "a NULL pointer");
	if (conn_need_registrations(c, "registrations") < 0)
		return -EOPNOTSUPP;
	/* The pages the driver locks: every page the range touches. */
	first = (uintptr_t)p & ~(page - 1);
	if (__builtin_add_overflow((uintptr_t)p, size, &end) || end > UINTPTR_MAX - page)
		return err_set(-EINVAL, "the range at %p of %zu bytes wraps around the address space", p, size);
	end = (end + page - 1) & ~(page - 1);
	acquire_message(&acq, end - first, opts,
			PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY |
				PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE);
	if (reg_backing(first, end, &backing))
		acq.backing = &backing;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &acq;
	r = acquire_call(c, &req, "a registration", flags, false, &reg, ret);
	if (r == 0 && *ret)
		(*ret)->shared_memory = acq.backing != NULL;
	return r;
}

int register_charge_bytes(pb_client *c, size_t bytes, const struct pb_acquire_opts *opts, pb_lease **ret)
{
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct pb_acquire_opts o = opts ? *opts : (struct pb_acquire_opts){ 0 };
	struct reg_span reg = { NULL, bytes };

	if (!ret)
		return err_set(-EINVAL, "register_charge_bytes: ret is NULL");
	*ret = NULL;
	if (!c)
		return err_set(-ENOTCONN, "not connected to a broker");
	if (bytes == 0)
		return err_set(-EINVAL, "cannot charge 0 bytes");
	if (conn_need_registrations(c, "registrations") < 0)
		return -EOPNOTSUPP;
	/* Nothing of ours to register: the driver owns the pages. */
	o.flags |= PB_REGISTER_CHARGE_ONLY;
	acquire_message(&acq, bytes, &o,
			PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_REGISTER_ONLY |
				PINBROKER__V1__ACQUIRE_FLAG__ACQUIRE_FLAG_NO_REVOKE);
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &acq;
	return acquire_call(c, &req, "a registration", o.flags, false, &reg, ret);
}

int pb_unregister(pb_client *c, pb_lease *l)
{
	if (!l)
		return 0;
	if (!l->registration)
		return err_set(-EINVAL, "lease %llu is not a registration: give it back with pb_release",
			       (unsigned long long)l->id);
	return pb_release(c, l);
}

int pb_lease_registration(const pb_lease *l)
{
	return l && l->registration;
}

int pb_lease_shared_memory(const pb_lease *l)
{
	return l && l->registration && l->shared_memory;
}

int pb_report_unbrokered(pb_client *c, uint64_t bytes)
{
	Pinbroker__V1__ReportUnbrokered ru = PINBROKER__V1__REPORT_UNBROKERED__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct waiter w;
	int r;

	if (!c)
		return err_set(-ENOTCONN, "not connected to a broker");
	if (conn_need_registrations(c, "unbrokered reports") < 0)
		return -EOPNOTSUPP;
	ru.bytes = bytes;
	req.body_case = PINBROKER__V1__REQUEST__BODY_REPORT_UNBROKERED;
	req.report_unbrokered = &ru;
	r = conn_call_checked(c, &req, &w);
	if (r < 0)
		return r;
	conn_waiter_cleanup(&w);
	return 0;
}
