/* SPDX-License-Identifier: MIT */
/* Small helpers shared by daemon, library and pinctl: size parsing and formatting, clocks, pidfd calls, small
 * files read whole. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/types.h>

/*
 * Parse a byte size: a decimal number with an optional K, M, G or T suffix
 * (powers of 1024; "KiB", "MB" and friends are accepted too, also binary).
 * Returns 0 and sets *ret, or -EINVAL (not a size) or -ERANGE (overflows).
 */
int parse_size(const char *s, uint64_t *ret);

/*
 * Parse "SIZE" or "N%". A percentage sets *pct (0..100, fractions allowed) and
 * *is_pct = true; a size sets *bytes. Returns 0, -EINVAL or -ERANGE.
 */
int parse_size_or_pct(const char *s, uint64_t *bytes, double *pct, bool *is_pct);

/* Format bytes as "1.5 GiB" / "512 KiB" / "17 B" into buf. Returns buf. */
char *format_size(uint64_t bytes, char *buf, size_t len);

/* CLOCK_MONOTONIC in microseconds and milliseconds. */
uint64_t now_us(void);
uint64_t now_ms(void);

/* Round x up to a multiple of align (a power of two or not); 0 on overflow. */
uint64_t round_up(uint64_t x, uint64_t align);
/*
 * Room for one more element in v (n in use, *cap allocated, elem_bytes each): v itself while n < *cap,
 * else v reallocated to twice *cap (first when empty), *cap updated. NULL when out of memory, with v
 * and *cap untouched.
 */
void *grow_array(void *v, size_t *cap, size_t n, size_t elem_bytes, size_t first);

/*
 * pidfd_open(2) and pidfd_send_signal(2) (no siginfo) through syscall(2), for
 * C libraries older than their wrappers (glibc 2.36); the one place that
 * knows their numbers. Return as the syscalls do: an fd or 0, else -1 with
 * errno set.
 */
int sys_pidfd_open(pid_t pid, unsigned flags);
int sys_pidfd_send_signal(int pidfd, int sig, unsigned flags);
/*
 * Test only: from now on sys_pidfd_open fails with ENOSYS, as under valgrind 3.19, an old kernel or a
 * seccomp sandbox (the daemon's PINBROKER_TEST_NO_PIDFD=all, daemon/revoker/revoker.h); sys_pidfd_disabled says so
 * to the one caller that takes a pidfd another way (SO_PEERPIDFD).
 */
void sys_pidfd_disable(void);
bool sys_pidfd_disabled(void);
/*
 * The pidfd ioctls of include/uapi/linux/pidfd.h, for headers older than them: an fd of the pidfd's process's
 * pid namespace or user namespace (Linux 6.11); -1 with ENOTTY or EINVAL on an older kernel.
 */
#define PB_PIDFS_IOCTL_MAGIC 0xFF
#define PB_PIDFD_GET_PID_NAMESPACE _IO(PB_PIDFS_IOCTL_MAGIC, 5)
#define PB_PIDFD_GET_USER_NAMESPACE _IO(PB_PIDFS_IOCTL_MAGIC, 9)

/*
 * A whole small file (a /proc or /sys one, a config) into buf, NUL-terminated: path relative to dirfd (or
 * absolute, or AT_FDCWD). At most len - 1 bytes; the length read, or -errno.
 */
ssize_t read_text_at(int dirfd, const char *path, char *buf, size_t len);

/*
 * A file the daemon writes for itself (a state file, replaced by rename), whole, into *ret (malloc'd,
 * NUL-terminated, *len bytes before the NUL). It is read only when it is what such a writer leaves: not a symbolic
 * link (O_NOFOLLOW), a regular file, owned by this euid, that neither its group nor others may write, of one name
 * (no other hard link) and of at most max_bytes; a file someone else could have made or written could make the
 * caller trust what it says. Returns 0; -ENOENT when there is none; -EPERM when it is not such a file, or cannot
 * be opened, with *why saying why in a phrase for a log line ("another user owns it"); -ENOMEM. *ret is NULL
 * unless 0 is returned.
 */
int read_private_file(const char *path, uint64_t max_bytes, char **ret, size_t *len, const char **why);

/*
 * The kernel's boot id (/proc/sys/kernel/random/boot_id below proc_root, NULL for /) into buf, without its newline,
 * as a state file's "boot" line carries it; "" when it cannot be read or is not a uuid's text (0-9, a-f, '-').
 */
void read_boot_id(const char *proc_root, char *buf, size_t len);

/*
 * The start time (field 22, starttime, in clock ticks since boot) of a /proc/PID/stat line in buf. Read after the
 * LAST ')': the comm before it (field 2) may hold spaces and parens of its own ("a) (b c)"). Returns 0 with *out
 * set, or -EINVAL for a line that does not parse.
 */
int parse_proc_stat_starttime(const char *buf, uint64_t *out);
/* Numeric field number field (4 or later; 20 is num_threads) of a /proc/PID/stat line, as above. */
int parse_proc_stat_u64(const char *buf, int field, uint64_t *out);
/*
 * The first field (size, in pages) of a /proc/PID/statm or /proc/PID/task/TID/statm line in buf: 0 for a task
 * with no mm (a zombie, a task past exit_mm in do_exit). Returns 0 with *out set, or -EINVAL.
 */
int parse_proc_statm_size(const char *buf, uint64_t *out);
