/* SPDX-License-Identifier: MIT */
/* Finding 12 (config mode): a config file or folder that others can change is warned about, as sshd's StrictModes does, without refusing it. */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sec.h"

static char base[64];
static char conf[128];

static void setup(void)
{
	FILE *f;

	snprintf(base, sizeof(base), "/tmp/pbsec20.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	ck_assert_int_eq(chmod(base, 0755), 0);
	snprintf(conf, sizeof(conf), "%s/pinbrokerd.conf", base);
	f = fopen(conf, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "budget = 512M\nprewarm = 16M\n");
	fclose(f);
	ck_assert_int_eq(chmod(conf, 0644), 0);
}

static void teardown(void)
{
	sec_rm_rf(base);
}

/* pinbrokerd --check-config on path: must still say OK (a warning, not a refusal). */
static char *check_config(const char *path)
{
	char cmd[384], *out = NULL;
	int rc;

	snprintf(cmd, sizeof(cmd), "%s --check-config --config '%s' --hugetlb no", PINBROKERD_PATH, path);
	rc = run_capture(cmd, &out);
	ck_assert_msg(rc == 0 && strstr(out, "configuration OK"), "--check-config %s failed (exit %d):\n%s", path, rc,
		      out);
	return out;
}

START_TEST(test_file_others_can_write_is_warned_about)
{
	char want[384], *out;

	out = check_config(conf);
	ck_assert_msg(!strstr(out, "warning"), "a root-owned 0644 file in a 0755 folder is fine:\n%s", out);
	free(out);

	ck_assert_int_eq(chmod(conf, 0666), 0);
	out = check_config(conf);
	snprintf(want, sizeof(want), "%s: the config file is writable by group and others (mode 0666)", conf);
	ck_assert_msg(strstr(out, want), "no warning '%s' in:\n%s", want, out);
	snprintf(want, sizeof(want), "run chmod go-w %s", conf);
	ck_assert_msg(strstr(out, want), "the warning should say what to run:\n%s", out);
	ck_assert_uint_eq(sec_count(out, "warning:"), 1);
	free(out);

	ck_assert_int_eq(chmod(conf, 0620), 0);
	out = check_config(conf);
	ck_assert_msg(strstr(out, "is writable by its group (mode 0620)"), "group-writable is warned about too:\n%s",
		      out);
	free(out);
}
END_TEST

START_TEST(test_foreign_owner_and_open_folder_are_warned_about)
{
	char dir[128], real[192], link[192], want[512], *out;

	ck_assert_int_eq(chown(conf, SEC_UID_A, SEC_UID_A), 0);
	out = check_config(conf);
	snprintf(want, sizeof(want), "%s: the config file is owned by uid %d", conf, SEC_UID_A);
	ck_assert_msg(strstr(out, want) && strstr(out, "run chown root"), "no warning '%s' in:\n%s", want, out);
	free(out);
	ck_assert_int_eq(chown(conf, 0, 0), 0);

	/* The file is fine, its folder is not: the folder is named, through a symlink too. */
	snprintf(dir, sizeof(dir), "%s/open", base);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	ck_assert_int_eq(chmod(dir, 0777), 0);
	snprintf(real, sizeof(real), "%s/real.conf", dir);
	ck_assert_int_eq(rename(conf, real), 0);
	snprintf(link, sizeof(link), "%s/link.conf", base);
	ck_assert_int_eq(symlink(real, link), 0);
	out = check_config(link);
	snprintf(want, sizeof(want), "%s: its folder %s is writable by group and others (mode 0777)", link, dir);
	ck_assert_msg(strstr(out, want), "no warning '%s' in:\n%s", want, out);
	snprintf(want, sizeof(want), "run chmod go-w %s", dir);
	ck_assert_msg(strstr(out, want), "the warning should say what to run:\n%s", out);
	free(out);

	/* Sticky, as /tmp: others cannot replace a file they do not own there. */
	ck_assert_int_eq(chmod(dir, 01777), 0);
	out = check_config(link);
	ck_assert_msg(!strstr(out, "warning"), "a sticky folder is fine:\n%s", out);
	free(out);

	ck_assert_int_eq(chown(dir, SEC_UID_B, SEC_UID_B), 0);
	out = check_config(link);
	snprintf(want, sizeof(want), "its folder %s is owned by uid %d", dir, SEC_UID_B);
	ck_assert_msg(strstr(out, want), "no warning '%s' in:\n%s", want, out);
	free(out);
}
END_TEST

START_TEST(test_daemon_warns_once_at_start_and_at_reload)
{
	const char *args[] = { "--config", conf, "--log-level", "info", NULL };
	struct daemon d;
	char *log = NULL;

	ck_assert_int_eq(chmod(conf, 0664), 0);
	daemon_start(&d, args);
	log = daemon_log(&d);
	ck_assert_msg(log && sec_count(log, "the config file is writable by its group (mode 0664)") == 1,
		      "one warning at start expected:\n%s", itest_tail(log));
	free(log);

	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	for (int i = 0; i < 200; i++) {
		log = daemon_log(&d);
		if (log && strstr(log, "config reloaded"))
			break;
		free(log);
		log = NULL;
		usleep(20000);
	}
	ck_assert_msg(log && strstr(log, "config reloaded"), "the reload did not finish");
	ck_assert_msg(sec_count(log, "the config file is writable by its group (mode 0664)") == 2,
		      "one more warning at reload expected:\n%s", itest_tail(log));
	free(log);
	ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

CHECK_SUITE(suite, "sec_20_config_mode", "config_mode", setup, teardown, 60, test_file_others_can_write_is_warned_about,
	    test_foreign_owner_and_open_folder_are_warned_about, test_daemon_warns_once_at_start_and_at_reload)

SEC_MAIN(suite)
