/* SPDX-License-Identifier: MIT */
/* Integration suite for pinctl doctor: the real pinctl against the real daemon, host files from fixture roots, each check's status read from --json. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "itest.h"

#define TIMEOUT_S 60
#define EXIT_WARN 1
#define EXIT_USAGE 2
/* Issue 28: 3 is every pinctl command's "no daemon answers"; doctor's other failures moved from 3 to 4. */
#define EXIT_NO_DAEMON 3
#define EXIT_FAIL 4

static struct daemon dmn;
static char root[300];
/* Without root and with a small RLIMIT_MEMLOCK the daemon cannot lock its budget: daemon-memlock warns. */
static int base_exit;

/* The exit status doctor must give when the fixture's worst finding exits want. */
static int expect(int want)
{
	return want > base_exit ? want : base_exit;
}

/* Write text to root/rel, making its folders. */
static void put(const char *rel, const char *text)
{
	char path[600];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *p = path + strlen(root) + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		ck_assert_msg(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", path, strerror(errno));
		*p = '/';
	}
	f = fopen(path, "we");
	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

static void unput(const char *rel)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	ck_assert_int_eq(unlink(path), 0);
}

static void meminfo(unsigned total_mib, unsigned huge_total, unsigned huge_free)
{
	char buf[512];

	snprintf(buf, sizeof(buf),
		 "MemTotal:       %u kB\nMemFree:        %u kB\nMemAvailable:   %u kB\n"
		 "HugePages_Total:    %u\nHugePages_Free:     %u\nHugepagesize:       2048 kB\n",
		 total_mib * 1024, total_mib * 512, total_mib * 768, huge_total, huge_free);
	put("proc/meminfo", buf);
	snprintf(buf, sizeof(buf), "%u\n", huge_total);
	put("proc/sys/vm/nr_hugepages", buf);
}

/*
 * A fixture root where every check is ok: 8 GiB, no huge pages, THP advise, cgroup v2 without a
 * limit, PSI. No CUDA (PINBROKER_NO_CUDA: skip) and a systemctl that says enabled.
 */
/*
 * The socket closed to other users, as the shipped units make it (0660 group pinbroker). Without the group
 * pinbroker the daemon binds it 0666 in a 0755 folder under /tmp: open to every local user, which
 * socket-access warns about; the checks other than that one start from none.
 */
static mode_t bound_mode; /* the socket's mode as the daemon bound it at setup */

static void close_socket(void)
{
	ck_assert_int_eq(chmod(dmn.socket, 0660), 0);
}

static void setup(void)
{
	const char *const args[] = { NULL };
	char sh[600];

	struct rlimit rl;

	daemon_start(&dmn, args);
	{
		struct stat st;

		ck_assert_int_eq(stat(dmn.socket, &st), 0);
		bound_mode = st.st_mode & 07777;
	}
	close_socket();
	base_exit = geteuid() != 0 && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
				    rl.rlim_cur < (256u << 20)
			    ? EXIT_WARN
			    : 0;
	snprintf(root, sizeof(root), "%s/root", dmn.dir);
	ck_assert_int_eq(mkdir(root, 0755), 0);
	meminfo(8192, 0, 0);
	put("sys/kernel/mm/transparent_hugepage/shmem_enabled", "always within_size [advise] never deny force\n");
	put("proc/self/cgroup", "0::/system.slice/pinbrokerd.service\n");
	put("sys/fs/cgroup/system.slice/pinbrokerd.service/memory.max", "max\n");
	put("sys/fs/cgroup/system.slice/memory.max", "max\n");
	put("proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
				    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
	put("systemctl",
	    "#!/bin/sh\necho \"${PB_FAKE_ENABLED:-enabled}\"\n[ \"${PB_FAKE_ENABLED:-enabled}\" = enabled ]\n");
	snprintf(sh, sizeof(sh), "%s/systemctl", root);
	ck_assert_int_eq(chmod(sh, 0755), 0);
	ck_assert_int_eq(setenv("PINBROKER_DOCTOR_ROOT", root, 1), 0);
	ck_assert_int_eq(setenv("PINBROKER_DOCTOR_SYSTEMCTL", sh, 1), 0);
	ck_assert_int_eq(setenv("PINBROKER_NO_CUDA", "1", 1), 0);
}

static void teardown(void)
{
	daemon_stop(&dmn);
}

/* pinctl doctor --json; its output in *out, its exit status returned. */
static int doctor(char **out)
{
	return pinctl(&dmn, out, "doctor --json");
}

/* The status of one check in doctor's JSON ("" when the check is missing); its message goes to msg. */
static const char *status_of(const char *json, const char *check, char *msg, size_t len)
{
	static char st[16];
	char key[80];
	const char *p, *m;

	st[0] = '\0';
	snprintf(key, sizeof(key), "{\"check\":\"%s\",\"status\":\"", check);
	p = strstr(json, key);
	if (!p)
		return st;
	p += strlen(key);
	snprintf(st, sizeof(st), "%.*s", (int)strcspn(p, "\""), p);
	m = strstr(p, "\"message\":\"");
	if (msg && m) {
		m += strlen("\"message\":\"");
		snprintf(msg, len, "%.*s", (int)strcspn(m, "\""), m);
	}
	return st;
}

#define ASSERT_CHECK(json, check, want)                                                                           \
	do {                                                                                                      \
		char msg_[700];                                                                                   \
		const char *got_ = status_of(json, check, msg_, sizeof(msg_));                                    \
		ck_assert_msg(strcmp(got_, want) == 0, "%s: want %s, got '%s' (%s)\n%s", check, want, got_, msg_, \
			      json);                                                                              \
	} while (0)

static void assert_message(const char *json, const char *check, const char *needle)
{
	char msg[700];

	status_of(json, check, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, needle), "%s: '%s' not in '%s'", check, needle, msg);
}

/*
 * Runs pinctl doctor --json and asserts its exit status, the status of one check and that each of the
 * NULL-ended strings after it is in that check's message. Returns the JSON for more asserts; the caller frees it.
 */
static __attribute__((sentinel)) char *doctor_says(int want_exit, const char *check, const char *want, ...)
{
	const char *needle;
	va_list ap;
	char *out;
	int r = doctor(&out);

	ck_assert_msg(r == want_exit, "%s: exit %d, want %d\n%s", check, r, want_exit, out);
	ASSERT_CHECK(out, check, want);
	va_start(ap, want);
	while ((needle = va_arg(ap, const char *)))
		assert_message(out, check, needle);
	va_end(ap);
	return out;
}

START_TEST(test_healthy_fixture_is_all_ok_and_exits_0)
{
	static const char *const checks[] = {
		"socket",           "groups", "socket-access", "daemon-memlock", "caller-memlock",
		"hugepages",        "thp",    "thp-collapse",  "cuda",           "cgroup",
		"cgroup-namespace", "psi",    "service",       "budget"
	};
	char *out, tail[64];
	int r = doctor(&out);

	ck_assert_msg(r == expect(0), "exit %d\n%s", r, out);
	/* Issue 28: an object with a schema_version (it was a bare array), its exit status in it. */
	ck_assert_msg(strncmp(out, "{\"schema_version\":1,\"checks\":[{\"check\":\"socket\",", 45) == 0,
		      "not {schema_version, checks}: %s", out);
	snprintf(tail, sizeof(tail), "\"warnings\":%d,\"failures\":0,\"exit_status\":%d}\n", base_exit ? 1 : 0,
		 expect(0));
	ck_assert_msg(strlen(out) > strlen(tail) && strcmp(out + strlen(out) - strlen(tail), tail) == 0,
		      "want it to end %s: %s", tail, out);
	for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
		const char *st = status_of(out, checks[i], NULL, 0);

		if (base_exit && strcmp(checks[i], "daemon-memlock") == 0)
			continue;
		ck_assert_msg(strcmp(st, "ok") == 0 || strcmp(st, "skip") == 0, "%s: %s\n%s", checks[i], st, out);
	}
	/* Under a fixture root the kernel is not tried, and PINBROKER_NO_CUDA skips the driver. */
	ASSERT_CHECK(out, "thp-collapse", "skip");
	ASSERT_CHECK(out, "cuda", "skip");
	ASSERT_CHECK(out, "socket", "ok");
	assert_message(out, "budget", "256 MiB");
	free(out);
}
END_TEST

START_TEST(test_thp_never_and_advise_collapse_deny_warns)
{
	char *out;

	free(doctor_says(expect(0), "thp", "ok", "advise", NULL));
	/* MADV_COLLAPSE ignores the shmem setting but for deny (the H200 pool collapsed with never). */
	put("sys/kernel/mm/transparent_hugepage/shmem_enabled", "always within_size advise [never] deny force\n");
	free(doctor_says(expect(0), "thp", "ok", "never", NULL));
	put("sys/kernel/mm/transparent_hugepage/shmem_enabled", "always within_size advise never [deny] force\n");
	out = doctor_says(expect(EXIT_WARN), "thp", "warn", NULL);
	ck_assert_ptr_nonnull(strstr(out, "\"fix\":\"echo never"));
	free(out);
	unput("sys/kernel/mm/transparent_hugepage/shmem_enabled");
	free(doctor_says(expect(EXIT_WARN), "thp", "warn", NULL));
}
END_TEST

START_TEST(test_hugepages_none_some_and_none_free)
{
	free(doctor_says(expect(0), "hugepages", "ok", "no huge pages reserved", NULL));
	meminfo(8192, 512, 512);
	free(doctor_says(expect(0), "hugepages", "ok", "512 huge pages of 2 MiB reserved, 512 free (1 GiB)", NULL));
	meminfo(8192, 512, 0);
	free(doctor_says(expect(EXIT_WARN), "hugepages", "warn", "none free", NULL));
}
END_TEST

START_TEST(test_cgroup_v2_limits)
{
	free(doctor_says(expect(0), "cgroup", "ok", "v2", "no memory limit", NULL));
	/* 4 GiB on the service: the 256 MiB budget fits. */
	put("sys/fs/cgroup/system.slice/pinbrokerd.service/memory.max", "4294967296\n");
	free(doctor_says(expect(0), "cgroup", "ok", "memory limit 4 GiB", NULL));
	/* The lower limit of an ancestor counts. */
	put("sys/fs/cgroup/system.slice/memory.max", "419430400\n");
	free(doctor_says(expect(EXIT_WARN), "cgroup", "warn", "400 MiB", NULL));
	put("sys/fs/cgroup/system.slice/memory.max", "209715200\n");
	free(doctor_says(EXIT_FAIL, "cgroup", "fail", "under the budget", NULL));
}
END_TEST

START_TEST(test_cgroup_v1_and_hybrid)
{
	put("proc/self/cgroup", "5:memory:/pinbroker/job\n4:pids:/\n1:name=systemd:/\n0::/\n");
	put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put("sys/fs/cgroup/memory/pinbroker/memory.limit_in_bytes", "9223372036854771712\n");
	put("sys/fs/cgroup/memory/pinbroker/job/memory.limit_in_bytes", "9223372036854771712\n");
	free(doctor_says(expect(0), "cgroup", "ok", "hybrid, memory on v1", "no memory limit", NULL));
	put("proc/self/cgroup", "5:memory:/pinbroker/job\n4:pids:/\n");
	put("sys/fs/cgroup/memory/pinbroker/job/memory.limit_in_bytes", "8589934592\n");
	free(doctor_says(expect(0), "cgroup", "ok", "cgroup v1", "memory limit 8 GiB", NULL));
	put("sys/fs/cgroup/memory/pinbroker/memory.limit_in_bytes", "104857600\n");
	free(doctor_says(expect(EXIT_FAIL), "cgroup", "fail", "100 MiB", NULL));
}
END_TEST

START_TEST(test_no_psi_warns)
{
	char *out;

	unput("proc/pressure/memory");
	out = doctor_says(expect(EXIT_WARN), "psi", "warn", NULL);
	ck_assert_ptr_nonnull(strstr(out, "CONFIG_PSI"));
	free(out);
	put("proc/pressure/memory", "garbage\n");
	free(doctor_says(expect(EXIT_WARN), "psi", "warn", NULL));
}
END_TEST

START_TEST(test_budget_against_memtotal)
{
	meminfo(400, 0, 0); /* 256 MiB of 400 MiB: 64% */
	free(doctor_says(expect(EXIT_WARN), "budget", "warn", "64% of MemTotal 400 MiB", NULL));
	meminfo(200, 0, 0);
	free(doctor_says(expect(EXIT_FAIL), "budget", "fail", NULL));
}
END_TEST

START_TEST(test_service_enabled_disabled_absent)
{
	char *out;

	ck_assert_int_eq(setenv("PB_FAKE_ENABLED", "disabled", 1), 0);
	out = doctor_says(expect(EXIT_WARN), "service", "warn", NULL);
	ck_assert_ptr_nonnull(strstr(out, "systemctl enable --now pinbrokerd.socket"));
	free(out);
	ck_assert_int_eq(setenv("PB_FAKE_ENABLED", "not-found", 1), 0);
	free(doctor_says(expect(EXIT_WARN), "service", "warn", "not installed", NULL));
	/* No systemctl at all (an empty path stands for one not found): skipped, saying so. */
	ck_assert_int_eq(setenv("PINBROKER_DOCTOR_SYSTEMCTL", "", 1), 0);
	free(doctor_says(expect(0), "service", "skip", "no systemctl", NULL));
}
END_TEST

START_TEST(test_cuda_driver_version_and_gpu_memory)
{
	char *out, *cmd;
	int r;

	/* The stand-in libcuda.so.1 of tests/preload: driver API 13.0, one GPU of 16 GiB. */
	unsetenv("PINBROKER_NO_CUDA");
	ck_assert_int_ge(asprintf(&cmd, "LD_LIBRARY_PATH='%s' %s --socket '%s' doctor --json", STUB_DIR, PINCTL_PATH,
				  dmn.socket),
			 0);
	r = run_capture(cmd, &out);
	ck_assert_msg(r == expect(0), "exit %d\n%s", r, out);
	ASSERT_CHECK(out, "cuda", "ok");
	assert_message(out, "cuda", "driver API 13.0, 1 GPU with 16 GiB");
	assert_message(out, "budget", "within the GPUs' 16 GiB");
	free(out);
	free(cmd);
	/* No driver on the path: a warning, not a failure. */
	ck_assert_int_ge(
		asprintf(&cmd, "LD_LIBRARY_PATH=/nonexistent %s --socket '%s' doctor --json", PINCTL_PATH, dmn.socket),
		0);
	r = run_capture(cmd, &out);
	if (!strstr(out, "\"check\":\"cuda\",\"status\":\"ok\"")) { /* a host with a real driver says ok */
		ck_assert_msg(r == expect(EXIT_WARN), "exit %d\n%s", r, out);
		ASSERT_CHECK(out, "cuda", "warn");
	}
	free(out);
	free(cmd);
}
END_TEST

START_TEST(test_daemon_found_and_admin_group_checked)
{
	char *out;

	daemon_stop(&dmn);
	daemon_start(&dmn, ITEST_ARGS("--admin-group", "pinbroker-no-such-group"));
	close_socket();
	out = doctor_says(expect(EXIT_WARN), "groups", "warn", "pinbroker-no-such-group", NULL);
	if (!base_exit)
		ASSERT_CHECK(out, "daemon-memlock", "ok");
	assert_message(out, "daemon-memlock", "pinbrokerd (pid ");
	free(out);
}
END_TEST

START_TEST(test_no_daemon_fails_socket_and_skips_budget)
{
	char *out;

	daemon_stop(&dmn);
	/* No daemon answering and nothing else failing: every command's 3 (issue 28), with how to start one. */
	out = doctor_says(EXIT_NO_DAEMON, "socket", "fail", NULL);
	ASSERT_CHECK(out, "daemon-memlock", "skip");
	ASSERT_CHECK(out, "budget", "skip");
	ASSERT_CHECK(out, "socket-access", "skip");
	ck_assert_msg(strstr(out, "sudo pinbrokerd --socket ") &&
			      strstr(out, "systemctl enable --now pinbrokerd.socket"),
		      "%s", out);
	ck_assert_ptr_nonnull(strstr(out, "\"exit_status\":3}"));
	free(out);
	daemon_start(&dmn, (const char *const[]){ NULL });
	close_socket();
}
END_TEST

START_TEST(test_human_output_usage_and_help)
{
	char *out;

	unput("proc/pressure/memory");
	ck_assert_int_eq(pinctl(&dmn, &out, "doctor"), expect(EXIT_WARN));
	ck_assert_ptr_nonnull(strstr(out, "warn  psi"));
	ck_assert_ptr_nonnull(strstr(out, "fix: boot a kernel with CONFIG_PSI=y"));
	ck_assert_ptr_nonnull(strstr(out, base_exit ? "2 warnings, 0 failures" : "1 warning, 0 failures"));
	free(out);
	/* Issue 28: a command's usage error points to its own help; a failure is 4, 3 being no daemon. */
	itest_pinctl_says(&dmn, EXIT_USAGE, "doctor extra", "see 'pinctl doctor --help'", NULL);
	itest_pinctl_says(&dmn, EXIT_USAGE, "doctor --bogus", "unknown option --bogus", NULL);
	itest_pinctl_says(&dmn, 0, "doctor --help", "Usage: pinctl doctor", "4 a failure", "3 no daemon answers", NULL);
	if (!base_exit) {
		put("proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
					    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
		itest_pinctl_says(&dmn, 0, "doctor", "0 warnings, 0 failures: nothing to do", NULL);
	}
}
END_TEST

/* Issue 28: a socket any local user may connect to is flagged; a folder closed to others makes it fine. */
START_TEST(test_world_usable_socket_warns)
{
	char *out;

	/* Without the group pinbroker the daemon itself bound 0666; with it, 0660, opened here as a careless admin would. */
	ck_assert_int_eq(chmod(dmn.socket, (bound_mode & S_IWOTH) ? bound_mode : 0666), 0);
	ck_assert_int_eq(chmod(dmn.dir, 0755), 0);
	out = doctor_says(EXIT_WARN, "socket-access", "warn", "any local user may connect", "mode 0666", NULL);
	/* A daemon started by hand, as this one and scripts/demo.sh's are (issue 41): advice for that case, not the
	 * unit's SocketMode= nor a restart it has no unit for. */
	ck_assert_msg(strstr(out, "was started by hand") && strstr(out, "mkdir -m 0700") && strstr(out, "kill "), "%s",
		      out);
	ck_assert_ptr_null(strstr(out, "SocketMode=0660"));
	free(out);
	/* A folder on the way that others cannot search keeps them out whatever the socket's mode. */
	ck_assert_int_eq(chmod(dmn.dir, 0750), 0);
	free(doctor_says(expect(0), "socket-access", "ok", "keeps other users out", NULL));
	ck_assert_int_eq(chmod(dmn.dir, 0755), 0);
	close_socket();
	free(doctor_says(expect(0), "socket-access", "ok", "only its owner and group may connect", NULL));
}
END_TEST

/* Issue 28: doctor exits 0 when its advice is "nothing to do": no driver on a host with no NVIDIA GPU is that. */
START_TEST(test_no_nvidia_gpu_and_no_driver_is_nothing_to_do)
{
	char *out, *cmd;
	int r;

	unsetenv("PINBROKER_NO_CUDA");
	put("sys/bus/pci/devices/0000:00:02.0/vendor", "0x8086\n");
	put("sys/bus/pci/devices/0000:00:02.0/class", "0x030000\n");
	ck_assert_int_ge(
		asprintf(&cmd, "LD_LIBRARY_PATH=/nonexistent %s --socket '%s' doctor --json", PINCTL_PATH, dmn.socket),
		0);
	r = run_capture(cmd, &out);
	if (!strstr(out, "\"check\":\"cuda\",\"status\":\"ok\",\"message\":\"libcuda.so.1, driver")) {
		/* No driver here (a host with one says ok above, and is not what this case is about). */
		ck_assert_msg(r == expect(0), "exit %d\n%s", r, out);
		ASSERT_CHECK(out, "cuda", "ok");
		assert_message(out, "cuda", "no NVIDIA GPU on the PCI bus");
	}
	free(out);
	/* An NVIDIA 3D controller without a usable driver: advice worth taking, a warning. */
	put("sys/bus/pci/devices/0000:41:00.0/vendor", "0x10de\n");
	put("sys/bus/pci/devices/0000:41:00.0/class", "0x030200\n");
	r = run_capture(cmd, &out);
	if (!strstr(out, "\"check\":\"cuda\",\"status\":\"ok\",\"message\":\"libcuda.so.1, driver")) {
		ck_assert_msg(r == expect(EXIT_WARN), "exit %d\n%s", r, out);
		ASSERT_CHECK(out, "cuda", "warn");
	}
	free(out);
	free(cmd);
}
END_TEST

CHECK_SUITE(doctor_suite, "itest_doctor", "doctor", setup, teardown, TIMEOUT_S,
	    test_healthy_fixture_is_all_ok_and_exits_0, test_thp_never_and_advise_collapse_deny_warns,
	    test_hugepages_none_some_and_none_free, test_cgroup_v2_limits, test_cgroup_v1_and_hybrid, test_no_psi_warns,
	    test_budget_against_memtotal, test_service_enabled_disabled_absent, test_cuda_driver_version_and_gpu_memory,
	    test_daemon_found_and_admin_group_checked, test_no_daemon_fails_socket_and_skips_budget,
	    test_human_output_usage_and_help, test_world_usable_socket_warns,
	    test_no_nvidia_gpu_and_no_driver_is_nothing_to_do)

CHECK_MAIN(doctor_suite)
