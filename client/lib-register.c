/* SPDX-License-Identifier: MIT */
/* libpinbroker's registrations: the caller's own memory charged (pb_register), unbrokered pinning reported. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdint.h>
#include <unistd.h>

int pb_register(pb_client *c, void *p, size_t size, const struct pb_acquire_opts *opts, pb_lease **ret)
{
	Pinbroker__V1__Acquire acq = PINBROKER__V1__ACQUIRE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint32_t flags = opts ? opts->flags : 0;
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), first, end;
	struct reg_span reg = { p, size };

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
	req.body_case = PINBROKER__V1__REQUEST__BODY_ACQUIRE;
	req.acquire = &acq;
	return acquire_call(c, &req, "a registration", flags, false, &reg, ret);
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
