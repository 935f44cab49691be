/* SPDX-License-Identifier: MIT */
/*
 * Integration: what the interposer needs from the daemon, against the real binary.
 * Registration charges (memory the program owns, counted, not pool memory), leases
 * that are never revoked, and unbrokered reports, each under a real pinbrokerd with
 * real processes killed by real signals.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdstore.h"
#include "itest.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)

static struct daemon d;
static const struct pb_acquire_opts charge_only = { .flags = PB_REGISTER_CHARGE_ONLY, .label = "reg" };

ITEST_FIXTURE_START(start, d, NULL)

ITEST_FIXTURE_STOP(stop, d)

static struct pb_status *status(void)
{
	return itest_status(d.socket);
}

static uint64_t unbrokered_now(void)
{
	struct pb_status *s = status();
	uint64_t v = s->unbrokered_bytes;

	pb_status_free(s);
	return v;
}

START_TEST(test_registration_charges_every_touched_page_and_no_pool_memory)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	char *buf = mmap(NULL, 8 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct pb_status *before, *s;
	const struct pb_lease_info *row;
	pb_client *c;
	pb_lease *l;

	ck_assert_ptr_ne(buf, MAP_FAILED);
	before = status();
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	/* 100 bytes in, one page and a bit long: it touches two pages, and both are locked. */
	ck_assert_int_eq(pb_register(c, buf + 100, page + 1, &charge_only, &l), 0);
	ck_assert_ptr_eq(pb_lease_data(l), buf + 100);
	ck_assert_int_eq(pb_lease_registration(l), 1);
	ck_assert_uint_eq(pb_lease_size(l), 2 * page);

	s = status();
	ck_assert_uint_eq(s->leased_bytes, before->leased_bytes + 2 * page);
	ck_assert_uint_eq(s->registered_bytes, 2 * page);
	ck_assert_uint_eq(s->no_revoke_bytes, 2 * page);
	/* Not pool memory: the warm pool neither shrinks to lend it nor grows. */
	ck_assert_uint_eq(s->pool_bytes, before->pool_bytes);
	row = itest_lease_row(s, pb_lease_id(l));
	ck_assert_ptr_nonnull(row);
	ck_assert_int_eq(row->registration, 1);
	ck_assert_int_eq(row->no_revoke, 1);
	ck_assert_str_eq(row->label, "reg");
	pb_status_free(s);

	/* Nothing another process could map: a registration is never shared. */
	{
		char token[PB_SHARE_TOKEN_LEN];

		ck_assert_int_eq(pb_lease_share(c, l, NULL, 0, token), -EINVAL);
		ck_assert_ptr_nonnull(strstr(pb_last_error(), "registration"));
	}
	/* The program's memory is untouched by the charge and by its return. */
	buf[100] = 0x5a;
	ck_assert_int_eq(pb_unregister(c, l), 0);
	ck_assert_int_eq(buf[100], 0x5a);
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)before->leased_bytes, 3000), (int64_t)before->leased_bytes);
	s = status();
	ck_assert_uint_eq(s->registered_bytes, 0);
	ck_assert_uint_eq(s->no_revoke_bytes, 0);
	pb_status_free(s);
	pb_status_free(before);
	pb_disconnect(c);
	munmap(buf, 8 * page);
}
END_TEST

START_TEST(test_registration_refusals_and_bad_arguments)
{
	static char small[4096];
	void *big = mmap(NULL, 512 * MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	pb_client *c;
	pb_lease *l = NULL, *acq;

	ck_assert_ptr_ne(big, MAP_FAILED);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	/* More than the whole budget (256M here) can never be charged. */
	ck_assert_int_eq(pb_register(c, big, 512 * MiB, &charge_only, &l), -EFBIG);
	ck_assert_ptr_null(l);
	/* What the budget has left is the limit: the rest is lent. */
	ck_assert_int_eq(pb_acquire(c, 200 * MiB,
				    &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE },
				    &acq),
			 0);
	ck_assert_int_eq(pb_register(c, big, 100 * MiB, &charge_only, &l), -ENOSPC);
	ck_assert_int_eq(pb_release(c, acq), 0);
	ck_assert_int_eq(pb_register(c, NULL, 10, &charge_only, &l), -EINVAL);
	ck_assert_int_eq(pb_register(c, small, 0, &charge_only, &l), -EINVAL);
	ck_assert_int_eq(pb_register(c, (void *)(UINTPTR_MAX - 100), 4096, &charge_only, &l), -EINVAL);
	/* pb_unregister is for registrations only. */
	ck_assert_int_eq(pb_acquire(c, MiB,
				    &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE },
				    &acq),
			 0);
	ck_assert_int_eq(pb_unregister(c, acq), -EINVAL);
	ck_assert_int_eq(pb_release(c, acq), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	pb_disconnect(c);
	munmap(big, 512 * MiB);
}
END_TEST

/*
 * Without CHARGE_ONLY the library registers with CUDA itself: on a GPU host the range is
 * registered; where the driver is missing the call fails and the charge goes back.
 */
START_TEST(test_registration_registers_with_cuda_or_gives_the_charge_back)
{
	static char buf[3 * 4096] __attribute__((aligned(4096)));
	pb_client *c;
	pb_lease *l = NULL;
	int r;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	r = pb_register(c, buf, sizeof(buf), &(struct pb_acquire_opts){ .flags = PB_ACQUIRE_MAPPED }, &l);
	if (pb_cuda_available(NULL)) {
		ck_assert_msg(r == 0, "pb_register: %s", pb_last_error());
		ck_assert_int_eq(pb_lease_cuda_registered(l), 1);
		ck_assert_int_eq(status_leased(d.socket), (int64_t)sizeof(buf));
		ck_assert_int_eq(pb_unregister(c, l), 0);
	} else {
		ck_assert_int_eq(r, -ENODEV);
		ck_assert_ptr_null(l);
	}
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_no_revoke_leases_are_never_revoked_by_admin_or_pressure_order)
{
	const struct pb_acquire_opts pinned = {
		.flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE | PB_ACQUIRE_NO_REVOKE, .label = "interposed"
	};
	const struct pb_acquire_opts plain = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE, .label = "coop" };
	struct pb_status *s;
	pb_client *c;
	pb_lease *nr, *coop;
	char *out = NULL;
	uint64_t *ids = NULL;
	size_t n = 0;
	int r;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &pinned, &nr), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &plain, &coop), 0);
	s = status();
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(nr))->no_revoke, 1);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(nr))->registration, 0);
	ck_assert_int_eq(itest_lease_row(s, pb_lease_id(coop))->no_revoke, 0);
	ck_assert_uint_eq(s->no_revoke_bytes, 4 * MiB);
	pb_status_free(s);

	/* Named by id, the admin is told why and what to do; nothing changes. */
	r = pinctl(&d, &out, "revoke %llu", (unsigned long long)pb_lease_id(nr));
	ck_assert_int_ne(r, 0);
	ck_assert_msg(strstr(out, "cannot give memory back") && strstr(out, "stop the process"), "pinctl said: %s",
		      out);
	free(out);
	/* Revoke-all takes only the cooperative lease. */
	ck_assert_int_eq(pb_admin_revoke(c, PB_REVOKE_ALL, 0, 0, 500, &ids, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(ids[0], pb_lease_id(coop));
	free(ids);
	ck_assert_int_eq(pb_lease_kind(nr), PB_MEM_LOCKED);
	ck_assert_int_eq(pb_release(c, coop), 0);
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)(4 * MiB), 3000), (int64_t)(4 * MiB));
	/* Never cached by the library either: the daemon could not take it back from a cache. */
	ck_assert_int_eq(pb_release(c, nr), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	pb_disconnect(c);
}
END_TEST

START_TEST(test_unbrokered_reports_replace_each_other_and_die_with_the_connection)
{
	pb_client *c, *c2;
	struct pb_status *s;
	char *out = NULL;

	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_connect(d.socket, &c2), 0);
	ck_assert_int_eq(pb_report_unbrokered(c, 3 * MiB), 0);
	ck_assert_int_eq(pb_report_unbrokered(c2, 1 * MiB), 0);
	ck_assert_uint_eq(unbrokered_now(), 4 * MiB);
	ck_assert_int_eq(pb_report_unbrokered(c, 1 * MiB), 0);
	ck_assert_uint_eq(unbrokered_now(), 2 * MiB);
	/* Over 16 TiB is a lie (and, times max-connections, would wrap the sum): refused, the last report stands. */
	ck_assert_int_eq(pb_report_unbrokered(c, 1ull << 51), -EINVAL);
	ck_assert_int_eq(pb_report_unbrokered(c, (1ull << 44) + 1), -EINVAL);
	ck_assert_uint_eq(unbrokered_now(), 2 * MiB);

	s = status();
	for (size_t i = 0, seen = 0; i < s->n_clients; i++)
		if (s->clients[i].unbrokered_bytes == MiB)
			ck_assert_uint_le(++seen, 2);
	/* Unbrokered bytes are outside the budget: they are not leased. */
	ck_assert_uint_eq(s->leased_bytes, 0);
	pb_status_free(s);
	ck_assert_int_eq(pinctl(&d, &out, "status"), 0);
	ck_assert_msg(strstr(out, "unbrokered:   2 MiB pinned outside the budget"), "pinctl status said: %s", out);
	free(out);

	pb_disconnect(c2);
	for (int t = 0; t < 300 && unbrokered_now() != MiB; t++)
		usleep(10000);
	ck_assert_uint_eq(unbrokered_now(), MiB);
	ck_assert_int_eq(pb_report_unbrokered(c, 0), 0);
	ck_assert_uint_eq(unbrokered_now(), 0);
	pb_disconnect(c);
}
END_TEST

/* A registered program killed by SIGKILL: its charge and its report go with it. */
START_TEST(test_killed_registrant_returns_its_charge_and_report)
{
	int p[2];
	pid_t pid = itest_fork_piped(p, NULL);

	if (pid == 0) {
		static char buf[16 * 4096] __attribute__((aligned(4096)));
		pb_client *c;
		pb_lease *l;

		close(p[0]);
		if (pb_connect(d.socket, &c) < 0 || pb_register(c, buf, sizeof(buf), &charge_only, &l) < 0 ||
		    pb_report_unbrokered(c, 5 * MiB) < 0)
			_exit(1);
		itest_child_ready(p, 2);
	}
	itest_wait_ready(p);
	ck_assert_int_eq(status_leased(d.socket), 16 * 4096);
	ck_assert_uint_eq(unbrokered_now(), 5 * MiB);
	kill(pid, SIGKILL);
	ck_assert_int_eq(itest_wait_exit(pid), 128 + SIGKILL);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	ck_assert_uint_eq(unbrokered_now(), 0);
}
END_TEST

/* The uid's share of never-revoked memory is a setting: past it the daemon says so, and revocable leases still come. */
START_TEST(test_never_revoked_memory_is_capped_per_uid)
{
	static const char *const args[] = { "--max-no-revoke-per-uid", "8M", NULL };
	const struct pb_acquire_opts nr = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE | PB_ACQUIRE_NO_REVOKE };
	const struct pb_acquire_opts plain = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE };
	static char buf[4 * 4096] __attribute__((aligned(4096)));
	pb_client *c;
	pb_lease *a, *reg, *more = NULL, *p;

	ck_assert_int_eq(daemon_stop(&d), 0);
	daemon_restart(&d, args);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 8 * MiB - sizeof(buf), &nr, &a), 0);
	ck_assert_int_eq(pb_register(c, buf, sizeof(buf), &charge_only, &reg), 0);
	ck_assert_int_eq(pb_acquire(c, 4096, &nr, &more), -EUSERS);
	ck_assert_ptr_null(more);
	ck_assert_msg(strstr(pb_last_error(), "max-no-revoke-per-uid"), "said: %s", pb_last_error());
	ck_assert_int_eq(pb_register(c, buf, 4096, &charge_only, &more), -EUSERS);
	ck_assert_int_eq(pb_acquire(c, 8 * MiB, &plain, &p), 0);
	ck_assert_int_eq(pb_release(c, p), 0);
	ck_assert_int_eq(pb_unregister(c, reg), 0);
	ck_assert_int_eq(pb_register(c, buf, sizeof(buf), &charge_only, &reg), 0);
	ck_assert_int_eq(pb_unregister(c, reg), 0);
	ck_assert_int_eq(pb_release(c, a), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	pb_disconnect(c);
}
END_TEST

/* A never-revoked lease kept in the fd store across a crash is still never revoked; a registration is forgotten. */
START_TEST(test_restart_keeps_never_revoked_leases_unrevokable)
{
	static const char *const args[] = { "--redeclare-grace-ms", "2000", NULL };
	const struct pb_acquire_opts nr = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE | PB_ACQUIRE_NO_REVOKE };
	static char buf[2 * 4096] __attribute__((aligned(4096)));
	struct pb_status *st = NULL;
	struct fdstore *fs;
	pb_client *c;
	pb_lease *l, *reg;
	uint64_t *ids = NULL;
	size_t n = 1;

	daemon_prepare(&d);
	fs = fdstore_new(&d);
	fdstore_daemon_start(fs, args);
	ck_assert_int_eq(pb_connect(d.socket, &c), 0);
	ck_assert_int_eq(pb_acquire(c, 4 * MiB, &nr, &l), 0);
	ck_assert_int_eq(pb_register(c, buf, sizeof(buf), &charge_only, &reg), 0);

	fdstore_daemon_crash_restart(fs, args, c);
	ck_assert_int_eq(pb_lease_stale(l), 0);
	ck_assert_int_eq(pb_lease_stale(reg), 1);
	st = status();
	ck_assert_uint_eq(st->leased_bytes, 4 * MiB);
	ck_assert_uint_eq(st->no_revoke_bytes, 4 * MiB);
	ck_assert_int_eq(itest_lease_row(st, pb_lease_id(l))->no_revoke, 1);
	pb_status_free(st);
	ck_assert_int_eq(pb_admin_revoke(c, PB_REVOKE_ALL, 0, 0, 500, &ids, &n), 0);
	ck_assert_uint_eq(n, 0);
	free(ids);
	ck_assert_int_eq(pb_unregister(c, reg), 0);
	ck_assert_int_eq(pb_release(c, l), 0);
	itest_end_clean(&d, c, 3000);
	fdstore_free(fs);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-register");

	CHECK_CASE(s, "register", start, stop, 60, test_registration_charges_every_touched_page_and_no_pool_memory,
		   test_registration_refusals_and_bad_arguments,
		   test_registration_registers_with_cuda_or_gives_the_charge_back,
		   test_no_revoke_leases_are_never_revoked_by_admin_or_pressure_order,
		   test_unbrokered_reports_replace_each_other_and_die_with_the_connection,
		   test_killed_registrant_returns_its_charge_and_report, test_never_revoked_memory_is_capped_per_uid);
	CHECK_CASE(s, "restart", NULL, NULL, 60, test_restart_keeps_never_revoked_leases_unrevokable);
	return s;
}

CHECK_MAIN(suite)
