/* SPDX-License-Identifier: MIT */
/*
 * Integration: pb_headroom against the real pinbrokerd on a fixture proc root. For each bound, a daemon where it
 * binds: the headroom names it, an acquire of a page more is refused with that bound's status and words, and an
 * acquire of exactly the headroom is granted (the refusal changed nothing, so the state is the one asked about).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"
#include "procfix.h"
#include "pinbroker.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)
#define HELD_MAX 8

static struct daemon d;
static char root[256];

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/* One row's world: the asking client, another client (holding others' memory), and the leases they hold. */
struct world {
	pb_client *c, *other;
	pb_client *held_by[HELD_MAX];
	pb_lease *held[HELD_MAX];
	int nheld;
};

static int take(pb_client *c, uint64_t size, unsigned flags, pb_lease **l)
{
	struct pb_acquire_opts o = { .flags = PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_NO_CACHE | flags, .label = "headroom" };

	return pb_acquire(c, size, &o, l);
}

static void hold(struct world *w, pb_client *c, uint64_t size, unsigned flags)
{
	pb_lease *l = NULL;
	int r = take(c, size, flags, &l);

	ck_assert_msg(r == 0, "holding %llu bytes: %s", (unsigned long long)size, pb_last_error());
	ck_assert_int_lt(w->nheld, HELD_MAX);
	w->held_by[w->nheld] = c;
	w->held[w->nheld++] = l;
}

/* Ask until the pressure state is state (the sampler polls every 100 ms), at most 5 s. */
static void wait_state(struct world *w, const char *state)
{
	struct pb_headroom h;

	for (int i = 0; i < 250; i++) {
		ck_assert_int_eq(pb_headroom(w->c, 0, &h), 0);
		if (strcmp(h.state, state) == 0)
			return;
		usleep(20000);
	}
	ck_abort_msg("the pressure state never became %s (it is %s)", state, h.state);
}

static void s_budget(struct world *w)
{
	hold(w, w->other, 10 * MiB, 0);
}
static void s_uid_quota(struct world *w)
{
	hold(w, w->c, 5 * MiB, 0);
}
static void s_job_quota(struct world *w)
{
	itest_pinctl_says(&d, 0, "quota set /slurm/job_1 8M", NULL);
	hold(w, w->c, 3 * MiB, 0);
}
static void s_no_revoke(struct world *w)
{
	hold(w, w->c, 3 * MiB, PB_ACQUIRE_NO_REVOKE);
}
static void s_tight(struct world *w)
{
	hold(w, w->c, 4 * MiB, 0);
	procfix_set_mem_available_pct(root, 8.0); /* tight: below 10%, above 5% */
	wait_state(w, "tight");
}
static void s_critical(struct world *w)
{
	procfix_set_mem_available_pct(root, 3.0); /* below critical (5%) */
	wait_state(w, "critical");
}
static void s_two_leases(struct world *w)
{
	hold(w, w->c, 2 * MiB, 0);
	hold(w, w->c, 2 * MiB, 0);
}
static void s_one_chunk(struct world *w)
{
	hold(w, w->c, 2 * MiB, 0);
}

static const struct row {
	const char *name;
	const char *args[8];
	void (*setup)(struct world *w);
	unsigned flags;
	int binding;        /* enum pb_bound_kind */
	int refused;        /* pb_acquire's errno a page above the headroom */
	const char *says;   /* in the refusal's words */
	uint64_t available; /* what the spec says is left; UINT64_MAX: whatever the warm pool holds */
} rows[] = {
	{ "budget", { "--budget", "64M" }, s_budget, 0, PB_BOUND_BUDGET, -ENOSPC, "budget", 54 * MiB },
	{ "uid-quota",
	  { "--budget", "64M", "--uid-quota", "16M" },
	  s_uid_quota,
	  0,
	  PB_BOUND_UID_QUOTA,
	  -EDQUOT,
	  "quota",
	  11 * MiB },
	{ "job-quota", { "--budget", "64M" }, s_job_quota, 0, PB_BOUND_JOB_QUOTA, -EDQUOT, "job", 5 * MiB },
	{ "no-revoke",
	  { "--budget", "64M", "--max-no-revoke-per-uid", "8M" },
	  s_no_revoke,
	  PB_ACQUIRE_NO_REVOKE,
	  PB_BOUND_NO_REVOKE,
	  -EUSERS,
	  "never revoked",
	  5 * MiB },
	{ "tight", { "--budget", "64M" }, s_tight, 0, PB_BOUND_PRESSURE, -EBUSY, "tight", UINT64_MAX },
	{ "tight-no-revoke",
	  { "--budget", "64M" },
	  s_tight,
	  PB_ACQUIRE_NO_REVOKE,
	  PB_BOUND_PRESSURE,
	  -EBUSY,
	  "tight",
	  0 },
	{ "critical", { "--budget", "64M" }, s_critical, 0, PB_BOUND_PRESSURE, -EAGAIN, "critical", 0 },
	{ "uid-leases",
	  { "--budget", "64M", "--max-leases-per-uid", "2" },
	  s_two_leases,
	  0,
	  PB_BOUND_UID_LEASES,
	  -EUSERS,
	  "max-leases-per-uid",
	  0 },
	{ "conn-leases",
	  { "--budget", "64M", "--max-leases-per-client", "2" },
	  s_two_leases,
	  0,
	  PB_BOUND_CONN_LEASES,
	  -EUSERS,
	  "max-leases-per-client",
	  0 },
	{ "uid-chunks",
	  { "--budget", "64M", "--chunk-size", "2M", "--chunk-max", "2M", "--max-chunks-per-uid", "4" },
	  s_one_chunk,
	  0,
	  PB_BOUND_UID_CHUNKS,
	  -EUSERS,
	  "max-chunks-per-uid",
	  6 * MiB },
};

START_TEST(test_headroom_is_granted_and_a_page_more_refused_by_its_bound)
{
	const struct row *r = &rows[_i];
	const char *args[24] = { "--proc-root",        root,  "--prewarm",       "0",
				 "--poll-interval-ms", "100", "--hysteresis-ms", "800" };
	size_t n = 8;
	struct world w = { 0 };
	struct pb_headroom h;
	pb_lease *l = NULL;
	char path[400];
	int rc;

	if (r->setup == s_job_quota && geteuid() != 0) {
		check_skip("the job-quota row needs root (pinctl quota set is an admin's)");
		return;
	}
	itest_proc_root(root, sizeof(root), "pbheadroom", NULL);
	/* This process's job, as the daemon reads it under the fixture root when it connects. */
	snprintf(path, sizeof(path), "%s/proc/%d", root, (int)getpid());
	ck_assert(mkdir(path, 0755) == 0 || errno == EEXIST);
	snprintf(path, sizeof(path), "%s/proc/%d/cgroup", root, (int)getpid());
	write_file(path, "0::/slurm/job_1\n");
	for (size_t i = 0; i < 8 && r->args[i]; i++)
		args[n++] = r->args[i];
	args[n] = NULL;
	daemon_start(&d, args);
	ck_assert_int_eq(pb_connect(d.socket, &w.c), 0);
	ck_assert_int_eq(pb_connect(d.socket, &w.other), 0);
	r->setup(&w);

	ck_assert_int_eq(pb_headroom(w.c, r->flags, &h), 0);
	ck_assert_uint_lt(h.binding, h.n_bounds);
	ck_assert_msg(h.bounds[h.binding].kind == r->binding, "%s: binds %d (%s), expected %d", r->name,
		      h.bounds[h.binding].kind, h.bounds[h.binding].reason, r->binding);
	ck_assert_msg(h.page_bytes > 0 && h.available_bytes % h.page_bytes == 0, "%s: %llu not in pages of %llu",
		      r->name, (unsigned long long)h.available_bytes, (unsigned long long)h.page_bytes);
	if (r->available != UINT64_MAX)
		ck_assert_msg(h.available_bytes == r->available, "%s: headroom %llu, expected %llu", r->name,
			      (unsigned long long)h.available_bytes, (unsigned long long)r->available);
	ck_assert_msg(h.bounds[h.binding].reason[0], "%s: the binding bound has no reason", r->name);

	rc = take(w.c, h.available_bytes + h.page_bytes, r->flags, &l);
	ck_assert_msg(rc == r->refused, "%s: a page above the headroom (%llu) gave %d (%s), expected %d", r->name,
		      (unsigned long long)h.available_bytes, rc, rc ? pb_last_error() : "granted", r->refused);
	ck_assert_msg(strstr(pb_last_error(), r->says), "%s: the refusal does not name its bound: %s", r->name,
		      pb_last_error());
	if (h.available_bytes > 0) {
		rc = take(w.c, h.available_bytes, r->flags, &l);
		ck_assert_msg(rc == 0, "%s: the headroom (%llu) itself was refused: %s", r->name,
			      (unsigned long long)h.available_bytes, pb_last_error());
		pb_release(w.c, l);
	}
	for (int i = 0; i < w.nheld; i++)
		pb_release(w.held_by[i], w.held[i]);
	pb_disconnect(w.c);
	pb_disconnect(w.other);
	ck_assert_int_eq(daemon_stop(&d), 0);
	itest_proc_root_remove(root);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("itest_headroom");

	CHECK_LOOP_CASE(s, "bounds", NULL, NULL, 120, (int)(sizeof(rows) / sizeof(rows[0])),
			test_headroom_is_granted_and_a_page_more_refused_by_its_bound);
	return s;
}

CHECK_MAIN(suite)
