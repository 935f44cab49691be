/* SPDX-License-Identifier: MIT */
/*
 * Integration: libpinbroker-preload.so in unmodified programs, against the real
 * pinbrokerd. The programs (tests/preload/target.c) are built three ways, as
 * CUDA programs reach the driver: the shared runtime (symbols), the static
 * runtime (dlsym and cuGetProcAddress only) and the driver API, and run on a
 * stand-in libcuda.so.1 that records what it pinned itself. What the broker
 * sees is read from its status; what the driver did, from the programs.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "pinbroker.h"
#include "procfix.h"
#include "check_main.h"

#define MiB (1024ull * 1024ull)

static struct daemon d;

static const char *const targets[] = { TARGET_SHARED, TARGET_STATIC, TARGET_DRIVER };
static const char *const target_names[] = { "shared", "static", "driver" };

ITEST_FIXTURE_START(start, d, NULL)
/* A budget too small for the 32 MiB the fallback tests ask. */
ITEST_FIXTURE_START(start_small, d, ITEST_ARGS("--budget", "16M", "--prewarm", "4M"))
ITEST_FIXTURE_STOP(stop, d)

static struct pb_status *status(void);

/* A fixture proc root whose MemAvailable is 8% of MemTotal: tight (below 10%), not critical (5%). */
static char root[64];

static void start_tight(void)
{
	struct pb_status *s = NULL;

	itest_proc_root(root, sizeof(root), "pbroot", NULL);
	procfix_set_mem_available_pct(root, 8.0);
	daemon_start(&d, ITEST_ARGS("--proc-root", root, "--poll-interval-ms", "100"));
	for (int i = 0; i < 100; i++) {
		s = status();
		if (s->pressure_state && strcmp(s->pressure_state, "tight") == 0)
			break;
		pb_status_free(s);
		s = NULL;
		usleep(50 * 1000);
	}
	ck_assert_msg(s != NULL, "the daemon did not turn tight on the fixture");
	pb_status_free(s);
}

static void stop_tight(void)
{
	stop();
	itest_proc_root_remove(root);
}

struct run_opts {
	bool preload;
	const char *policy; /* PINBROKER_PRELOAD_FALLBACK, or NULL */
	const char *expect; /* PB_EXPECT */
	const char *label;
	const char *socket; /* NULL: the test daemon's */
	bool quiet;         /* its stderr to /dev/null: a run expected to fail its checks */
};

/* The program's environment as o says (in its child). */
static void set_env(const void *arg)
{
	const struct run_opts *o = arg;

	setenv("LD_LIBRARY_PATH", STUB_DIR, 1);
	setenv("PINBROKER_SOCKET", o->socket ? o->socket : d.socket, 1);
	setenv("PB_EXPECT", o->expect ? o->expect : "broker", 1);
	if (o->preload)
		setenv("LD_PRELOAD", PRELOAD_LIB, 1);
	if (o->policy)
		setenv("PINBROKER_PRELOAD_FALLBACK", o->policy, 1);
	if (o->label)
		setenv("PINBROKER_LABEL", o->label, 1);
}

/* Run bin with args as o says; its stdin closed (itest_prog_finish) makes `hold` free and exit. */
static void spawn(struct itest_prog *p, const char *bin, const struct run_opts *o, const char *const *args)
{
	const char *argv[16];
	size_t n = 0;

	argv[n++] = bin;
	for (size_t i = 0; args[i] && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	itest_prog_start(p, argv, o->quiet, set_env, o);
}

/* spawn, then the program's first line (its "ready" or an error) in buf. */
static void spawn_read(struct itest_prog *p, const char *bin, const struct run_opts *o, const char *const *args,
		       char *buf, size_t len)
{
	spawn(p, bin, o, args);
	itest_prog_read_line(p, buf, len);
}

static int run(const char *bin, const struct run_opts *o, const char *const *args)
{
	struct itest_prog p;

	spawn(&p, bin, o, args);
	return itest_prog_finish(&p, NULL, 0);
}

static struct pb_status *status(void)
{
	return itest_status(d.socket);
}

/* Rows of pid, sorted by size into bytes[] (at most max); returns how many. */
static size_t rows_of(const struct pb_status *s, pid_t pid, const char *label, uint64_t *bytes, int *registration,
		      size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < s->n_leases; i++) {
		const struct pb_lease_info *r = &s->leases[i];

		if (r->pid != pid || n == max)
			continue;
		ck_assert_str_eq(r->label, label);
		ck_assert_int_eq(r->no_revoke, 1);
		bytes[n] = r->bytes;
		registration[n] = r->registration;
		n++;
	}
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && bytes[j - 1] > bytes[j]; j--) {
			uint64_t t = bytes[j];
			int u = registration[j];

			bytes[j] = bytes[j - 1];
			registration[j] = registration[j - 1];
			bytes[j - 1] = t;
			registration[j - 1] = u;
		}
	return n;
}

/* Wait until the broker has nothing lent and nothing reported: what a program leaves when it is gone. */
static void wait_all_returned(void)
{
	ck_assert_int_eq(wait_leased(d.socket, 0, 10000), 0);
	for (int i = 0; i < 100; i++) {
		struct pb_status *s = status();
		uint64_t u = s->unbrokered_bytes;

		pb_status_free(s);
		if (u == 0)
			return;
		usleep(50 * 1000);
	}
	ck_abort_msg("unbrokered bytes still reported after the programs exited");
}

START_TEST(test_checks_pass_under_the_interposer_for_every_way_in)
{
	static const char *const args[] = { "check", NULL };
	struct run_opts o = { .preload = true, .label = "check" };

	ck_assert_msg(run(targets[_i], &o, args) == 0, "%s: the checks failed under the interposer", target_names[_i]);
	wait_all_returned();
}
END_TEST

/* The same checks without the interposer: the driver serves everything, and the broker checks fail. */
START_TEST(test_without_the_interposer_the_driver_serves_and_the_broker_checks_fail)
{
	static const char *const args[] = { "check", NULL };
	struct run_opts driver = { .expect = "driver" }, broker = { .expect = "broker", .quiet = true };
	struct pb_status *s;

	ck_assert_msg(run(targets[_i], &driver, args) == 0, "%s: the checks failed on the bare driver",
		      target_names[_i]);
	ck_assert_msg(run(targets[_i], &broker, args) == 1, "%s: the broker checks passed without the broker",
		      target_names[_i]);
	s = status();
	ck_assert_uint_eq(s->n_leases, 0);
	pb_status_free(s);
}
END_TEST

START_TEST(test_allocations_are_leases_of_the_page_rounded_size_and_come_back)
{
	static const char *const args[] = { "hold", "alloc", "1", "4097", "67108987", NULL };
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct run_opts o = { .preload = true, .label = "held" };
	uint64_t bytes[8];
	int reg[8];
	struct pb_status *s;
	struct itest_prog p;
	char line[256];

	spawn_read(&p, targets[_i], &o, args, line, sizeof(line));
	ck_assert_msg(strncmp(line, "ready", 5) == 0, "%s: %s", target_names[_i], line);
	/* The driver pinned nothing itself: it only registered the leases (libpinbroker did, PORTABLE|DEVICEMAP). */
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), 0);
	ck_assert_uint_eq(itest_prog_field(line, "reg="), page + 2 * page + (64 * MiB + page));
	s = status();
	ck_assert_uint_eq(rows_of(s, p.pid, "held", bytes, reg, 8), 3);
	ck_assert_uint_eq(bytes[0], page);
	ck_assert_uint_eq(bytes[1], 2 * page);
	ck_assert_uint_eq(bytes[2], 64 * MiB + page);
	ck_assert_int_eq(reg[0] | reg[1] | reg[2], 0);
	ck_assert_uint_eq(s->unbrokered_bytes, 0);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	ck_assert_str_eq(line, "freed alloc=0 reg=0");
	wait_all_returned();
}
END_TEST

START_TEST(test_registrations_and_write_combined_memory_are_charged)
{
	static const char *const reg_args[] = { "hold", "register", "1048581", NULL };
	static const char *const wc_args[] = { "hold", "wc", "65536", "65536", NULL };
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct run_opts o = { .preload = true, .label = "charged" };
	uint64_t bytes[8];
	int reg[8];
	struct pb_status *s;
	struct itest_prog p;
	char line[256];

	/* The program's own memory: registered by the driver, charged to the budget as a registration. */
	spawn_read(&p, targets[_i], &o, reg_args, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), 0);
	ck_assert_uint_eq(itest_prog_field(line, "reg="), 1048581);
	s = status();
	ck_assert_uint_eq(rows_of(s, p.pid, "charged", bytes, reg, 8), 1);
	ck_assert_uint_eq(bytes[0], MiB + page);
	ck_assert_int_eq(reg[0], 1);
	ck_assert_uint_eq(s->registered_bytes, MiB + page); /* a charge, not pool memory */
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	wait_all_returned();

	/* Write-combined: the driver's own allocation, charged the same way. */
	spawn_read(&p, targets[_i], &o, wc_args, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), 2 * 65536);
	s = status();
	ck_assert_uint_eq(rows_of(s, p.pid, "charged", bytes, reg, 8), 2);
	ck_assert_uint_eq(bytes[0], 65536);
	ck_assert_int_eq(reg[0] & reg[1], 1);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	ck_assert_str_eq(line, "freed alloc=0 reg=0");
	wait_all_returned();
}
END_TEST

/*
 * One /dev/shm region registered by three unmodified programs, one per way in (runtime symbols, the static
 * runtime, the driver API): the interposer's registrations name the file, and the region is charged once.
 */
START_TEST(test_a_shared_region_registered_by_every_rank_is_charged_once)
{
	static const char *const args[] = { "hold", "shm-register", "16777216", NULL };
	struct run_opts o = { .preload = true, .label = "kv" };
	struct itest_prog p[3];
	char name[64], line[256];
	struct pb_status *s;

	snprintf(name, sizeof(name), "/pb-itest-preload-shm-%d", (int)getpid());
	ck_assert_int_eq(setenv("PB_TEST_SHM", name, 1), 0);
	for (int i = 0; i < 3; i++) {
		spawn_read(&p[i], targets[i], &o, args, line, sizeof(line));
		/* The next ranks must not inherit its pipes: its stdin's end must be ours alone to close. */
		ck_assert_int_eq(fcntl(p[i].in, F_SETFD, FD_CLOEXEC), 0);
		ck_assert_int_eq(fcntl(fileno(p[i].out), F_SETFD, FD_CLOEXEC), 0);
		ck_assert_msg(strncmp(line, "ready", 5) == 0, "%s said: %s", target_names[i], line);
		ck_assert_uint_eq(itest_prog_field(line, "reg="), 16 * MiB);
	}
	unsetenv("PB_TEST_SHM");
	s = status();
	ck_assert_uint_eq(s->registered_bytes, 16 * MiB);
	ck_assert_uint_eq(s->leased_bytes, 16 * MiB);
	for (size_t i = 0; i < s->n_leases; i++)
		ck_assert_uint_eq(s->leases[i].registrants, 3);
	pb_status_free(s);
	/* The first rank ends: the others still register the region, so it stays charged, once. */
	ck_assert_int_eq(itest_prog_finish(&p[0], line, sizeof(line)), 0);
	ck_assert_int_eq(wait_leased(d.socket, (int64_t)(16 * MiB), 3000), (int64_t)(16 * MiB));
	ck_assert_int_eq(itest_prog_finish(&p[1], line, sizeof(line)), 0);
	ck_assert_int_eq(itest_prog_finish(&p[2], line, sizeof(line)), 0);
	ck_assert_int_eq(wait_leased(d.socket, 0, 3000), 0);
	shm_unlink(name);
	wait_all_returned();
}
END_TEST

START_TEST(test_a_killed_program_gives_everything_back)
{
	static const char *const args[] = { "hold", "alloc", "8388608", "12345", NULL };
	struct run_opts o = { .preload = true };
	struct itest_prog p;
	char line[256];

	spawn_read(&p, targets[_i], &o, args, line, sizeof(line));
	ck_assert_int_gt(status_leased(d.socket), 0);
	kill(p.pid, SIGKILL);
	close(p.in);
	fclose(p.out);
	itest_wait_exit(p.pid);
	wait_all_returned();
}
END_TEST

/* dlsym() and cuGetProcAddress() answers are the wrappers: the memory is a broker lease of the page-rounded size. */
/* Run target under the interposer with args: it holds one allocation of size through that lookup path, which must be
 * one lease (reg: a registration) of the page-rounded size; then it frees it and everything comes back. */
static void expect_one_looked_up_lease(const char *target, const char *name, const char *const *args, const char *got,
				       size_t size, int want_reg)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct run_opts o = { .preload = true, .label = "looked-up" };
	uint64_t bytes[4];
	int reg[4];
	struct pb_status *s;
	struct itest_prog p;
	char line[256];

	spawn_read(&p, target, &o, args, line, sizeof(line));
	ck_assert_msg(strncmp(line, "ready", 5) == 0, "%s: %s", name, line);
	ck_assert_uint_eq(itest_prog_field(line, got), want_reg ? size : 0);
	s = status();
	ck_assert_uint_eq(rows_of(s, p.pid, "looked-up", bytes, reg, 4), 1);
	ck_assert_uint_eq(bytes[0], (size + page - 1) / page * page);
	ck_assert_int_eq(reg[0], want_reg);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	ck_assert_str_eq(line, "freed alloc=0 reg=0");
	wait_all_returned();
}

START_TEST(test_lookup_paths_yield_leases_of_the_page_rounded_size)
{
	static const char *const by_dlsym[] = { "hold", "dlsym-driver", "20000", NULL };
	static const char *const by_dlsym_rt[] = { "hold", "dlsym-runtime", "20000", NULL };
	static const char *const by_gpa[] = { "hold", "gpa-register-6000", "12293", NULL };

	/* dlsym(libcuda handle, "cuMemHostAlloc"), as the static runtime finds the driver; and, with the shared
	 * runtime, dlsym(RTLD_DEFAULT, "cudaHostAlloc"), where the interposer's own export comes first. */
	expect_one_looked_up_lease(targets[_i], target_names[_i], by_dlsym, "alloc=", 20000, 0);
	if (_i == 0)
		expect_one_looked_up_lease(targets[_i], target_names[_i], by_dlsym_rt, "alloc=", 20000, 0);
	/* cuGetProcAddress("cuMemHostRegister") at CUDA 6.0: an unexported address, known by name and version. */
	expect_one_looked_up_lease(targets[_i], target_names[_i], by_gpa, "reg=", 12293, 1);
}
END_TEST

#ifndef __SANITIZE_ADDRESS__ /* see suite() */
/* fork() while threads allocate and report: every child finishes (a held lock would hang it; its alarm fails it). */
START_TEST(test_fork_while_other_threads_report_never_hangs_the_child)
{
	static const char *const refused[] = { "fork-stress", "alloc", "33554432", "60", NULL };
	static const char *const leased[] = { "fork-stress", "alloc", "4096", "60", NULL };
	static const char *const registered[] = { "fork-stress", "register", "33554432", "30", NULL };
	struct run_opts cuda = { .preload = true, .policy = "cuda" };

	/* Refused by the 16 MiB budget: the driver's memory, reported as unbrokered on every allocation and free. */
	ck_assert_msg(run(targets[_i], &cuda, refused) == 0, "%s: refused allocations", target_names[_i]);
	ck_assert_msg(run(targets[_i], &cuda, registered) == 0, "%s: refused registrations", target_names[_i]);
	/* Broker leases: the connection's and the table's locks. */
	ck_assert_msg(run(targets[_i], &cuda, leased) == 0, "%s: leases", target_names[_i]);
	wait_all_returned();
}
END_TEST
#endif

/* Tight: an interposed program's leases would be never revoked, so the daemon refuses them; the policy decides. */
START_TEST(test_tight_refuses_interposed_programs_and_the_fallback_decides)
{
	static const char *const hold[] = { "hold", "alloc", "1048576", NULL };
	static const char *const hold_reg[] = { "hold", "register", "1048576", NULL };
	static const char *const oom[] = { "expect-oom", "alloc", "4096", NULL };
	static const char *const oom_reg[] = { "expect-oom", "register", "4096", NULL };
	struct run_opts cuda = { .preload = true, .policy = "cuda" }, error = { .preload = true, .policy = "error" };
	struct pb_status *s;
	struct itest_prog p;
	char line[256];

	/* cuda: the real call, reported as unbrokered; nothing leased. */
	spawn_read(&p, targets[_i], &cuda, hold, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), MiB);
	s = status();
	ck_assert_str_eq(s->pressure_state, "tight");
	ck_assert_uint_eq(s->unbrokered_bytes, MiB);
	ck_assert_uint_eq(s->leased_bytes, 0);
	ck_assert_uint_eq(s->n_leases, 0);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	wait_all_returned();

	spawn_read(&p, targets[_i], &cuda, hold_reg, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "reg="), MiB);
	s = status();
	ck_assert_uint_eq(s->unbrokered_bytes, MiB);
	ck_assert_uint_eq(s->n_leases, 0);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	wait_all_returned();

	/* error: CUDA's out-of-memory error, however small the request. */
	ck_assert_int_eq(run(targets[_i], &error, oom), 0);
	ck_assert_int_eq(run(targets[_i], &error, oom_reg), 0);
}
END_TEST

/* Budget 16 MiB, 32 MiB asked: each policy's answer. */
START_TEST(test_fallback_policies_when_the_broker_refuses)
{
	static const char *const hold[] = { "hold", "alloc", "33554432", NULL };
	static const char *const hold_mapped[] = { "hold", "mapped", "33554432", NULL };
	static const char *const hold_reg[] = { "hold", "register", "33554432", NULL };
	static const char *const oom[] = { "expect-oom", "alloc", "33554432", NULL };
	static const char *const oom_reg[] = { "expect-oom", "register", "33554432", NULL };
	struct run_opts cuda = { .preload = true, .policy = "cuda" }, error = { .preload = true, .policy = "error" },
			pageable = { .preload = true, .policy = "pageable" };
	struct pb_status *s;
	struct itest_prog p;
	char line[256];

	/* cuda: the driver pins it, and the broker hears of it as unbrokered, until it is freed. */
	spawn_read(&p, targets[_i], &cuda, hold, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), 32 * MiB);
	s = status();
	ck_assert_uint_eq(s->unbrokered_bytes, 32 * MiB);
	ck_assert_uint_eq(s->leased_bytes, 0);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	wait_all_returned();

	spawn_read(&p, targets[_i], &cuda, hold_reg, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "reg="), 32 * MiB);
	s = status();
	ck_assert_uint_eq(s->unbrokered_bytes, 32 * MiB);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	wait_all_returned();

	/* dlsym(RTLD_DEFAULT, "cudaHostAlloc") finds the interposer's own export first: its fallback must still
	 * reach libcudart's, not recurse into itself. (The shared runtime only: the others export no runtime.) */
	if (_i == 0) {
		static const char *const hold_rt[] = { "hold", "dlsym-runtime", "33554432", NULL };

		spawn_read(&p, targets[_i], &cuda, hold_rt, line, sizeof(line));
		ck_assert_uint_eq(itest_prog_field(line, "alloc="), 32 * MiB);
		ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
		ck_assert_str_eq(line, "freed alloc=0 reg=0");
		wait_all_returned();
	}

	/* error: CUDA's out-of-memory error, for allocations and registrations. */
	ck_assert_int_eq(run(targets[_i], &error, oom), 0);
	ck_assert_int_eq(run(targets[_i], &error, oom_reg), 0);

	/* pageable: ordinary memory, nothing pinned, nothing reported... */
	spawn_read(&p, targets[_i], &pageable, hold, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), 0);
	ck_assert_uint_eq(itest_prog_field(line, "reg="), 0);
	s = status();
	ck_assert_uint_eq(s->unbrokered_bytes, 0);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	/* ...except where a device pointer is needed: mapped memory goes to the driver. */
	spawn_read(&p, targets[_i], &pageable, hold_mapped, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), 32 * MiB);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	wait_all_returned();
}
END_TEST

START_TEST(test_without_a_daemon_the_program_still_runs_on_the_driver)
{
	static const char *const args[] = { "check", NULL };
	struct run_opts o = { .preload = true, .expect = "driver", .socket = "/nonexistent/pinbroker.sock" };

	ck_assert_int_eq(run(targets[_i], &o, args), 0);
}
END_TEST

/* pinctl run: the interposer, the label and the policy set for the program, whatever its way in. */
START_TEST(test_pinctl_run_puts_a_program_under_the_budget)
{
	const char *args[] = { "--socket", d.socket,    "run",  "--label", "via-pinctl", "--fallback", "error",
			       "--",       targets[_i], "hold", "alloc",   "20000",      NULL };
	struct run_opts o = { .preload = false };
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uint64_t bytes[4];
	int reg[4];
	struct pb_status *s;
	struct itest_prog p;
	char line[256];

	spawn_read(&p, PINCTL_PATH, &o, args, line, sizeof(line));
	ck_assert_uint_eq(itest_prog_field(line, "alloc="), 0);
	s = status();
	/* pinctl execs the program: the lease is the pid's pinctl started as. */
	ck_assert_uint_eq(rows_of(s, p.pid, "via-pinctl", bytes, reg, 4), 1);
	ck_assert_uint_eq(bytes[0], (20000 + page - 1) / page * page);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	wait_all_returned();

	/* Its usage errors exit 2; a program that is not there, 127, as env(1) says. (Once is enough.) */
	if (_i != 0)
		return;
	itest_pinctl_says(&d, 2, "run --fallback sometimes -- true", "expected cuda, error or pageable", NULL);
	itest_pinctl_says(&d, 2, "run", NULL);
	itest_pinctl_says(&d, 127, "run -- /nonexistent/program", "cannot run /nonexistent/program", NULL);
}
END_TEST

/* A program whose name the daemon would refuse as a label still gets its leases, under a cleaned-up label. */
START_TEST(test_a_program_name_with_control_bytes_still_gets_leases)
{
	char dir[] = "/tmp/pbodd.XXXXXX", bin[96], cmd[256], line[256];
	const char *args[] = { "hold", "alloc", "4096", NULL };
	struct run_opts o = { .preload = true };
	uint64_t bytes[2];
	int reg[2];
	struct pb_status *s;
	struct itest_prog p;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(bin, sizeof(bin), "%s/odd\tname", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", TARGET_STATIC, bin);
	ck_assert_int_eq(system(cmd), 0);
	spawn_read(&p, bin, &o, args, line, sizeof(line));
	s = status();
	ck_assert_uint_eq(rows_of(s, p.pid, "preload:odd?name", bytes, reg, 2), 1);
	pb_status_free(s);
	ck_assert_int_eq(itest_prog_finish(&p, line, sizeof(line)), 0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
	wait_all_returned();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("integration-preload");
	int n = (int)(sizeof(targets) / sizeof(targets[0]));
	TCase *t, *small;

	t = CHECK_LOOP_CASE(
		s, "interposer", start, stop, 120, n, test_checks_pass_under_the_interposer_for_every_way_in,
		test_without_the_interposer_the_driver_serves_and_the_broker_checks_fail,
		test_allocations_are_leases_of_the_page_rounded_size_and_come_back,
		test_registrations_and_write_combined_memory_are_charged, test_a_killed_program_gives_everything_back,
		test_without_a_daemon_the_program_still_runs_on_the_driver,
		test_pinctl_run_puts_a_program_under_the_budget,
		test_lookup_paths_yield_leases_of_the_page_rounded_size);
	tcase_add_test(t, test_a_program_name_with_control_bytes_still_gets_leases);
	tcase_add_test(t, test_a_shared_region_registered_by_every_rank_is_charged_once);
	small = CHECK_LOOP_CASE(s, "fallback", start_small, stop, 120, n,
				test_fallback_policies_when_the_broker_refuses);
#ifndef __SANITIZE_ADDRESS__
	/* Not under ASan: GCC 12's libasan holds no allocator lock across fork(), so a child forked while
	 * another thread mallocs can hang in its first malloc (seen here in
	 * SizeClassAllocator64::GetFromAllocator), whatever the interposer does. */
	tcase_add_loop_test(small, test_fork_while_other_threads_report_never_hangs_the_child, 0, n);
#endif
	(void)small;
	CHECK_LOOP_CASE(s, "tight", start_tight, stop_tight, 120, n,
			test_tight_refuses_interposed_programs_and_the_fallback_decides);
	return s;
}

CHECK_MAIN(suite)
