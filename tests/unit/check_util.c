/* SPDX-License-Identifier: MIT */
/* Check suite for common/util: size parsing and formatting, rounding, clocks, private files read whole. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"
#include "check_main.h"

#define TIMEOUT_S 10

static uint64_t size_of(const char *s)
{
	uint64_t v = UINT64_C(0xdeadbeef);

	ck_assert_int_eq(parse_size(s, &v), 0);
	return v;
}

START_TEST(test_parse_size_plain_number_is_bytes)
{
	ck_assert_uint_eq(size_of("0"), 0);
	ck_assert_uint_eq(size_of("17"), 17);
	ck_assert_uint_eq(size_of("4096"), 4096);
	ck_assert_uint_eq(size_of("18446744073709551615"), UINT64_MAX);
}
END_TEST

START_TEST(test_parse_size_suffixes_are_powers_of_1024)
{
	ck_assert_uint_eq(size_of("4K"), 4096);
	ck_assert_uint_eq(size_of("4k"), 4096);
	ck_assert_uint_eq(size_of("4KB"), 4096);
	ck_assert_uint_eq(size_of("4KiB"), 4096);
	ck_assert_uint_eq(size_of("2M"), 2u << 20);
	ck_assert_uint_eq(size_of("2MiB"), 2u << 20);
	ck_assert_uint_eq(size_of("3G"), UINT64_C(3) << 30);
	ck_assert_uint_eq(size_of("3gb"), UINT64_C(3) << 30);
	ck_assert_uint_eq(size_of("1T"), UINT64_C(1) << 40);
	ck_assert_uint_eq(size_of("1TiB"), UINT64_C(1) << 40);
	ck_assert_uint_eq(size_of("512B"), 512);
}
END_TEST

START_TEST(test_parse_size_allows_space_before_suffix)
{
	ck_assert_uint_eq(size_of("  8 M"), 8u << 20);
}
END_TEST

START_TEST(test_parse_size_overflow_is_erange)
{
	uint64_t v = 42;

	ck_assert_int_eq(parse_size("18446744073709551616", &v), -ERANGE);
	ck_assert_int_eq(parse_size("16777216T", &v), -ERANGE); /* 2^24 * 2^40 = 2^64 */
	ck_assert_int_eq(parse_size("17179869184G", &v), -ERANGE);
	ck_assert_uint_eq(v, 42);
	ck_assert_uint_eq(size_of("16777215T"), UINT64_C(16777215) << 40);
}
END_TEST

START_TEST(test_parse_size_garbage_is_einval)
{
	static const char *const bad[] = { "",     " ",    "K",   "-1",  "+1",  "1.5G", "12Q",
					   "4 KK", "0x10", "1e3", "25%", "abc", "4K4",  "1PB" };
	uint64_t v = 42;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(parse_size(bad[i], &v) == -EINVAL, "'%s' should be -EINVAL", bad[i]);
	ck_assert_int_eq(parse_size(NULL, &v), -EINVAL);
	ck_assert_uint_eq(v, 42);
}
END_TEST

START_TEST(test_parse_size_or_pct_reads_percentages)
{
	static const struct {
		const char *text;
		double pct;
	} rows[] = { { "25%", 25.0 }, { "12.5%", 12.5 }, { "0%", 0.0 }, { "100%", 100.0 } };
	uint64_t bytes = 7;
	double pct = -1;
	bool is_pct = false;

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		ck_assert_int_eq(parse_size_or_pct(rows[i].text, &bytes, &pct, &is_pct), 0);
		ck_assert(is_pct);
		ck_assert_double_eq(pct, rows[i].pct);
	}
	ck_assert_uint_eq(bytes, 7);
}
END_TEST

START_TEST(test_parse_size_or_pct_reads_sizes)
{
	uint64_t bytes = 0;
	double pct = -1;
	bool is_pct = true;

	ck_assert_int_eq(parse_size_or_pct("256M", &bytes, &pct, &is_pct), 0);
	ck_assert(!is_pct);
	ck_assert_uint_eq(bytes, 256u << 20);
}
END_TEST

START_TEST(test_parse_size_or_pct_rejects_bad_percentages)
{
	uint64_t bytes;
	double pct;
	bool is_pct;

	ck_assert_int_eq(parse_size_or_pct("101%", &bytes, &pct, &is_pct), -ERANGE);
	ck_assert_int_eq(parse_size_or_pct("%", &bytes, &pct, &is_pct), -EINVAL);
	ck_assert_int_eq(parse_size_or_pct("-5%", &bytes, &pct, &is_pct), -EINVAL);
	ck_assert_int_eq(parse_size_or_pct("abc%", &bytes, &pct, &is_pct), -EINVAL);
	ck_assert_int_eq(parse_size_or_pct("5%%", &bytes, &pct, &is_pct), -EINVAL);
	ck_assert_int_eq(parse_size_or_pct("nan%", &bytes, &pct, &is_pct), -EINVAL);
	ck_assert_int_eq(parse_size_or_pct(NULL, &bytes, &pct, &is_pct), -EINVAL);
	ck_assert_int_eq(parse_size_or_pct("12Q", &bytes, &pct, &is_pct), -EINVAL);
}
END_TEST

START_TEST(test_format_size_picks_binary_unit)
{
	char buf[32];

	ck_assert_str_eq(format_size(0, buf, sizeof(buf)), "0 B");
	ck_assert_str_eq(format_size(17, buf, sizeof(buf)), "17 B");
	ck_assert_str_eq(format_size(1023, buf, sizeof(buf)), "1023 B");
	ck_assert_str_eq(format_size(1024, buf, sizeof(buf)), "1 KiB");
	ck_assert_str_eq(format_size(1536, buf, sizeof(buf)), "1.5 KiB");
	ck_assert_str_eq(format_size(512u << 10, buf, sizeof(buf)), "512 KiB");
	ck_assert_str_eq(format_size(UINT64_C(3) << 29, buf, sizeof(buf)), "1.5 GiB");
	ck_assert_str_eq(format_size(UINT64_C(1) << 40, buf, sizeof(buf)), "1 TiB");
	ck_assert_str_eq(format_size(UINT64_MAX, buf, sizeof(buf)), "16 EiB");
}
END_TEST

START_TEST(test_format_size_truncates_to_buffer)
{
	char buf[4];

	ck_assert_ptr_eq(format_size(1536, buf, sizeof(buf)), buf);
	ck_assert_str_eq(buf, "1.5");
}
END_TEST

START_TEST(test_round_up_to_multiples)
{
	ck_assert_uint_eq(round_up(0, 4096), 0);
	ck_assert_uint_eq(round_up(1, 4096), 4096);
	ck_assert_uint_eq(round_up(4096, 4096), 4096);
	ck_assert_uint_eq(round_up(4097, 4096), 8192);
	ck_assert_uint_eq(round_up(10, 3), 12);
	ck_assert_uint_eq(round_up(12, 3), 12);
	ck_assert_uint_eq(round_up(5, 0), 5);
	ck_assert_uint_eq(round_up(UINT64_MAX - 1, 2), UINT64_MAX - 1);
}
END_TEST

START_TEST(test_round_up_overflow_returns_zero)
{
	ck_assert_uint_eq(round_up(UINT64_MAX, 2), 0);
	ck_assert_uint_eq(round_up(UINT64_MAX - 4094, 4096), 0);
	ck_assert_uint_eq(round_up(UINT64_MAX, UINT64_MAX), UINT64_MAX);
}
END_TEST

START_TEST(test_clocks_are_monotonic_and_agree)
{
	uint64_t a = now_us(), ms = now_ms(), b = now_us();

	ck_assert_uint_ge(b, a);
	ck_assert_uint_ge(ms, a / 1000);
	ck_assert_uint_le(ms, b / 1000);
}
END_TEST

START_TEST(test_grow_array_doubles_only_when_full)
{
	size_t cap = 0, n;
	int *v = NULL, *nv;

	for (n = 0; n < 100; n++) {
		nv = grow_array(v, &cap, n, sizeof(*v), 4);
		ck_assert_ptr_nonnull(nv);
		v = nv;
		v[n] = (int)n;
		ck_assert_uint_ge(cap, n + 1);
	}
	ck_assert_uint_eq(cap, 128); /* 4, 8, ..., 128: doubled, never grown by one */
	for (n = 0; n < 100; n++)
		ck_assert_int_eq(v[n], (int)n);
	/* Not full: the same array, capacity untouched. */
	ck_assert_ptr_eq(grow_array(v, &cap, 100, sizeof(*v), 4), v);
	ck_assert_uint_eq(cap, 128);
	/* A size that cannot be allocated: NULL, the array and capacity as they were. */
	ck_assert_ptr_null(grow_array(v, &cap, 128, SIZE_MAX / 64, 4));
	ck_assert_uint_eq(cap, 128);
	free(v);
}
END_TEST

START_TEST(test_proc_stat_starttime_reads_field_22_after_last_paren)
{
	/* A comm with spaces and parens of its own: only the last ')' ends it. */
	const char *line = "4242 (a) (b c)) S 1 4242 4242 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 1 0 987654321 "
			   "12345678 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";
	uint64_t t = 0;

	ck_assert_int_eq(parse_proc_stat_starttime(line, &t), 0);
	ck_assert_uint_eq(t, 987654321);
	ck_assert_int_eq(parse_proc_stat_starttime("1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 42 9\n", &t),
			 0);
	ck_assert_uint_eq(t, 42);
	/* "x) y" inside the comm: the first ')' would read field 22 from the wrong place. */
	ck_assert_int_eq(parse_proc_stat_starttime("7 (x) 1 2 3) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0\n", &t),
			 0);
	ck_assert_uint_eq(t, 555);
	/* Field 20, num_threads: 1 here. */
	ck_assert_int_eq(parse_proc_stat_u64(line, 20, &t), 0);
	ck_assert_uint_eq(t, 1);
	ck_assert_int_eq(parse_proc_stat_u64("9 (w) 1) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 3 0 77 0\n", 20, &t), 0);
	ck_assert_uint_eq(t, 3);
	/* Field 3 (the state) is a letter: no number to read; nor before it. */
	ck_assert_int_eq(parse_proc_stat_u64(line, 3, &t), -EINVAL);
	ck_assert_int_eq(parse_proc_stat_u64(line, 1, &t), -EINVAL);
}
END_TEST

START_TEST(test_proc_stat_starttime_rejects_short_or_garbled_lines)
{
	uint64_t t = 7;

	ck_assert_int_eq(parse_proc_stat_starttime("", &t), -EINVAL);
	ck_assert_int_eq(parse_proc_stat_starttime("12 no paren S 1 2 3", &t), -EINVAL);
	ck_assert_int_eq(parse_proc_stat_starttime("12 (short) S 1 2 3\n", &t), -EINVAL);
	ck_assert_int_eq(parse_proc_stat_starttime("12 (bad) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 x 1\n", &t),
			 -EINVAL);
	ck_assert_uint_eq(t, 7);
}
END_TEST

START_TEST(test_proc_statm_size_reads_first_field)
{
	uint64_t v = 1;

	ck_assert_int_eq(parse_proc_statm_size("0 0 0 0 0 0 0\n", &v), 0);
	ck_assert_uint_eq(v, 0);
	ck_assert_int_eq(parse_proc_statm_size("65432 1200 800 10 0 3000 0\n", &v), 0);
	ck_assert_uint_eq(v, 65432);
	ck_assert_int_eq(parse_proc_statm_size("", &v), -EINVAL);
	ck_assert_int_eq(parse_proc_statm_size("x 1 2\n", &v), -EINVAL);
	ck_assert_uint_eq(v, 65432);
}
END_TEST

static char tmp_dir[] = "/tmp/check_util.XXXXXX";
static bool tmp_made;

/* A temp folder's path + name into buf; the folder is made on the first call. */
static const char *tmp_path(char *buf, size_t len, const char *name)
{
	if (!tmp_made)
		ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
	tmp_made = true;
	snprintf(buf, len, "%s/%s", tmp_dir, name);
	return buf;
}

/* Remove the temp folder and the files the tests below make in it. */
static void tmp_remove(void)
{
	static const char *const names[] = { "ok",     "target", "symlink", "group", "others",
					     "linked", "link",   "big",     "fifo",  "nobody" };
	char path[256];

	if (!tmp_made)
		return;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unlink(tmp_path(path, sizeof(path), names[i]));
	rmdir(tmp_dir);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

/* read_private_file's verdict on path (with a 64-byte cap), and its reason when it refuses. */
static int read_private(const char *path, const char **why)
{
	char *text = NULL;
	size_t len = 0;
	int r;

	*why = NULL;
	r = read_private_file(path, 64, &text, &len, why);
	if (r == 0) {
		ck_assert_ptr_nonnull(text);
		ck_assert_uint_eq(len, strlen(text));
	} else {
		ck_assert_ptr_null(text);
	}
	free(text);
	return r;
}

START_TEST(test_private_file_of_this_uid_is_read_whole)
{
	char path[256], *text = NULL;
	size_t len = 0;
	const char *why = NULL;

	write_file(tmp_path(path, sizeof(path), "ok"), "line 1\nline 2\n", 0600);
	ck_assert_int_eq(read_private_file(path, 64, &text, &len, &why), 0);
	ck_assert_str_eq(text, "line 1\nline 2\n");
	ck_assert_uint_eq(len, 14);
	free(text);
	ck_assert_int_eq(read_private(tmp_path(path, sizeof(path), "missing"), &why), -ENOENT);
	tmp_remove();
}
END_TEST

START_TEST(test_private_file_refuses_what_another_could_have_made)
{
	char path[256], other[256];
	const char *why;

	/* A symbolic link to a good file. */
	write_file(tmp_path(other, sizeof(other), "target"), "x\n", 0600);
	ck_assert_int_eq(symlink(other, tmp_path(path, sizeof(path), "symlink")), 0);
	ck_assert_int_eq(read_private(path, &why), -EPERM);
	ck_assert_str_eq(why, "it is a symbolic link");
	/* Writable by its group, by others. */
	write_file(tmp_path(path, sizeof(path), "group"), "x\n", 0620);
	ck_assert_int_eq(read_private(path, &why), -EPERM);
	ck_assert_str_eq(why, "its group or others may write it");
	write_file(tmp_path(path, sizeof(path), "others"), "x\n", 0602);
	ck_assert_int_eq(read_private(path, &why), -EPERM);
	/* A second name for a file (a hard link someone made): neither name is read. */
	write_file(tmp_path(other, sizeof(other), "linked"), "x\n", 0600);
	ck_assert_int_eq(link(other, tmp_path(path, sizeof(path), "link")), 0);
	ck_assert_int_eq(read_private(path, &why), -EPERM);
	ck_assert_str_eq(why, "it has other hard links, so it is not a file this daemon wrote");
	ck_assert_int_eq(read_private(other, &why), -EPERM);
	/* Over the cap, and not a regular file. */
	write_file(tmp_path(path, sizeof(path), "big"),
		   "0123456789012345678901234567890123456789012345678901234567890123456789", 0600);
	ck_assert_int_eq(read_private(path, &why), -EPERM);
	ck_assert_str_eq(why, "it is larger than any this daemon writes");
	ck_assert_int_eq(mkfifo(tmp_path(path, sizeof(path), "fifo"), 0600), 0);
	ck_assert_int_eq(read_private(path, &why), -EPERM);
	ck_assert_str_eq(why, "it is not a regular file");
	/* Another uid's file: only root can make one here. */
	if (geteuid() == 0) {
		write_file(tmp_path(path, sizeof(path), "nobody"), "x\n", 0600);
		ck_assert_int_eq(chown(path, 65534, 65534), 0);
		ck_assert_int_eq(read_private(path, &why), -EPERM);
		ck_assert_str_eq(why, "another user owns it");
	}
	tmp_remove();
}
END_TEST

static const char *const boot_dirs[] = { "proc", "proc/sys", "proc/sys/kernel", "proc/sys/kernel/random" };

/* A proc root whose boot_id file holds text: its path (a new temp folder) in root. */
static void fake_boot_id(char *root, size_t len, const char *text)
{
	const size_t ndirs = sizeof(boot_dirs) / sizeof(boot_dirs[0]);
	char path[512];

	snprintf(root, len, "/tmp/check_util_boot.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	for (size_t i = 0; i < ndirs; i++) {
		snprintf(path, sizeof(path), "%s/%s", root, boot_dirs[i]);
		ck_assert_int_eq(mkdir(path, 0755), 0);
	}
	snprintf(path, sizeof(path), "%s/proc/sys/kernel/random/boot_id", root);
	write_file(path, text, 0644);
}

/* Remove what fake_boot_id made. */
static void remove_fake_root(const char *root)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/proc/sys/kernel/random/boot_id", root);
	unlink(path);
	for (size_t i = sizeof(boot_dirs) / sizeof(boot_dirs[0]); i-- > 0;) {
		snprintf(path, sizeof(path), "%s/%s", root, boot_dirs[i]);
		rmdir(path);
	}
	rmdir(root);
}

START_TEST(test_boot_id_is_the_uuid_line_or_empty)
{
	char root[64], buf[64];

	fake_boot_id(root, sizeof(root), "6f1d6a3c-2b8e-4f0a-9c51-0d2e7b4a9f13\n");
	read_boot_id(root, buf, sizeof(buf));
	ck_assert_str_eq(buf, "6f1d6a3c-2b8e-4f0a-9c51-0d2e7b4a9f13");
	remove_fake_root(root);
	/* Not a uuid's text (it goes into a file's line as is): nothing. */
	fake_boot_id(root, sizeof(root), "6f1d6a3c boot\nend\n");
	strcpy(buf, "x");
	read_boot_id(root, buf, sizeof(buf));
	ck_assert_str_eq(buf, "");
	remove_fake_root(root);
	/* No such file. */
	strcpy(buf, "x");
	read_boot_id("/nonexistent-proc-root", buf, sizeof(buf));
	ck_assert_str_eq(buf, "");
	/* The real one, where there is one: a uuid's 36 characters. */
	if (access("/proc/sys/kernel/random/boot_id", R_OK) == 0) {
		read_boot_id(NULL, buf, sizeof(buf));
		ck_assert_uint_eq(strlen(buf), 36);
	}
}
END_TEST

static Suite *util_suite(void)
{
	Suite *s = suite_create("util");

	CHECK_CASE(s, "parse_size", NULL, NULL, TIMEOUT_S, test_parse_size_plain_number_is_bytes,
		   test_parse_size_suffixes_are_powers_of_1024, test_parse_size_allows_space_before_suffix,
		   test_parse_size_overflow_is_erange, test_parse_size_garbage_is_einval);

	CHECK_CASE(s, "parse_size_or_pct", NULL, NULL, TIMEOUT_S, test_parse_size_or_pct_reads_percentages,
		   test_parse_size_or_pct_reads_sizes, test_parse_size_or_pct_rejects_bad_percentages);

	CHECK_CASE(s, "format_and_round", NULL, NULL, TIMEOUT_S, test_format_size_picks_binary_unit,
		   test_format_size_truncates_to_buffer, test_round_up_to_multiples,
		   test_round_up_overflow_returns_zero, test_grow_array_doubles_only_when_full,
		   test_clocks_are_monotonic_and_agree);

	CHECK_CASE(s, "proc_parse", NULL, NULL, TIMEOUT_S, test_proc_stat_starttime_reads_field_22_after_last_paren,
		   test_proc_stat_starttime_rejects_short_or_garbled_lines, test_proc_statm_size_reads_first_field);

	CHECK_CASE(s, "private_file", NULL, NULL, TIMEOUT_S, test_private_file_of_this_uid_is_read_whole,
		   test_private_file_refuses_what_another_could_have_made, test_boot_id_is_the_uuid_line_or_empty);
	return s;
}

CHECK_MAIN(util_suite)
