/* SPDX-License-Identifier: MIT */
/*
 * Finding every process of one uid that maps or holds a lease's memfds, through /proc as fuser does, and pinning each
 * by pidfd.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One memfd, as fstat() of the daemon's own chunk fd shows it. */
struct holder_key {
	dev_t dev;
	ino_t ino;
	uid_t uid; /* holders_scan: only processes of this uid are matched on it (holders_find sets it) */
};

/* A process found holding one of the keys. */
struct holder {
	pid_t pid;
	int pidfd;  /* opened before the last check, so it names the process that was checked */
	size_t key; /* index into the caller's keys of the memfd it maps or holds */
};

/*
 * Sort keys so the parsers below can look them up (holders_find sorts its own
 * copy). Keys are compared by (ino, dev).
 */
void holders_sort_keys(struct holder_key *keys, size_t nkeys);

/*
 * Scan the complete lines of a /proc/PID/maps buffer (buf need not be
 * NUL-terminated) for a mapping whose "major:minor inode" columns name one of
 * keys (sorted by holders_sort_keys). Only the dev and inode columns count: the
 * path column is whatever the mapper named its file. A last line without a
 * newline is never trusted: *consumed (optional) is the length up to the last
 * newline, so a streaming caller keeps the rest for its next read.
 * Returns the index into keys of the first match, or -ENOENT.
 */
int holders_parse_maps(const char *buf, size_t len, const struct holder_key *keys, size_t nkeys, size_t *consumed);

/*
 * The "Uid:" line of a /proc/PID/status buffer: real, effective, saved and
 * filesystem uid. Returns 0, or -EBADMSG when the line is missing, malformed
 * or not newline-terminated.
 */
int holders_parse_status_uid(const char *buf, size_t len, uid_t ret[4]);

/*
 * Every process under <proc_root>/proc whose real, effective and saved uid are
 * all uid, that maps one of keys or holds an fd to one, except pid 1, the
 * calling process and exclude_pid (0: none). Each is pinned by a pidfd opened
 * first and then checked again through the same /proc/PID directory fd (uid
 * and holding), so a pid reused between the scan and pidfd_open is never
 * returned. A process that exits or cannot be read meanwhile is skipped.
 *
 * Cost: one pass over /proc: for each process one read of status; for the
 * uid's own processes also their maps (stops at the first match) and, when no
 * mapping matched, one fstatat per open fd. Measured on the 2-core development
 * VM (kernel 6.18) with 1000 small processes: 5 ms when none is the uid's,
 * 30 ms when all are; a process's share grows with its maps and fd count.
 *
 * *ret is a malloc'd array of *n holders (NULL and 0 when none). *unreadable
 * (optional) counts processes of other uids or unknown uid whose status could
 * not be read (no CAP_SYS_PTRACE, or hidepid), so the caller can say that the
 * scan may have missed some. Returns 0, or -errno when <proc_root>/proc cannot
 * be opened, or -ENOMEM.
 */
int holders_find(const char *proc_root, uid_t uid, const struct holder_key *keys, size_t nkeys, pid_t exclude_pid,
		 struct holder **ret, size_t *n, size_t *unreadable);

/*
 * The same search in slices, for many keys of several uids at once: one pass
 * over /proc for every overdue lease of a deadline round, spread over loop
 * turns so that other clients are answered in between.
 * A process is matched only on a key whose uid is the process's real,
 * effective and saved uid, so a process is never reported for another uid's
 * memory it maps. keys must stay valid (unchanged) until the scan is freed;
 * exclude lists pids never reported (nexclude may be 0).
 * holders_scan_new returns 0 and *ret, -errno when <proc_root>/proc cannot be
 * opened, or -ENOMEM.
 */
struct holders_scan;
int holders_scan_new(const char *proc_root, const struct holder_key *keys, size_t nkeys, const pid_t *exclude,
		     size_t nexclude, struct holders_scan **ret);
/*
 * Examine /proc entries until budget_us has passed (at least one entry; one
 * process is examined whole, so a step can pass the budget by one process's
 * maps and fds). Returns 1 once the pass is complete, 0 when entries remain,
 * or -ENOMEM.
 */
int holders_scan_step(struct holders_scan *s, uint64_t budget_us);
/*
 * Take what was found so far (key: an index into the caller's keys) and how
 * many processes could not be read and were examined; the holders are the
 * caller's (holders_free).
 */
void holders_scan_take(struct holders_scan *s, struct holder **ret, size_t *n, size_t *unreadable, size_t *examined);
/* Close the scan and any holders not taken. NULL is fine. */
void holders_scan_free(struct holders_scan *s);

/*
 * Whether this process may read other users' /proc/PID/maps and fdinfo (it has
 * CAP_SYS_PTRACE in its effective set: root and the shipped unit's user have
 * it). Without it holders_find sees only the daemon's own uid, and under
 * ProtectProc=invisible it cannot even tell what it missed. Another uid's fd/
 * is listed only with CAP_DAC_READ_SEARCH as well (root); without it, an fd
 * held but not mapped is found through fdinfo's mount id and inode.
 */
bool holders_can_inspect_all(void);

/* A memfd of a given name that a process maps or holds an fd to (holders_scan_memfds). */
struct holders_memfd {
	pid_t pid;
	uid_t uid; /* the process's real uid */
	dev_t dev;
	ino_t ino;
	uint64_t bytes;     /* the file's size (a mapping: no more than where it ends in the file, offset + length) */
	uint64_t allocated; /* the file's pages in memory or swap (st_blocks), UINT64_MAX where not known */
	uid_t owner;        /* the file's owner (st_uid: whoever made the memfd), when owner_known */
	bool owner_known;   /* false where only maps could be read (map_files needs CAP_SYS_ADMIN) */
};

/* Called for each mapping or fd found; the same memfd may be reported several times, by one process or many. */
typedef void holders_memfd_fn(const struct holders_memfd *m, void *ud);
/* Called once per process whose maps and fd table were both read to the end (what it holds was all seen). */
typedef void holders_read_fn(pid_t pid, void *ud);

/*
 * Parse one /proc/PID/maps line (without its newline) of a mapping of the
 * memfd named name: its path column is exactly "/memfd:NAME (deleted)" (the
 * kernel's name for a memfd, which its holder cannot change). Returns 0 with
 * *dev, *ino and *end_bytes (file offset + mapping length), or -ENOENT.
 */
int holders_parse_memfd_map(const char *line, size_t len, const char *name, dev_t *dev, ino_t *ino,
			    uint64_t *end_bytes);

/*
 * Every process under <proc_root>/proc, of any uid, except pid 1 and the
 * calling process, that maps or holds an fd to a memfd named name: on_memfd
 * for each, then on_read (optional) for each process read completely. A
 * process this one may not read (another uid without CAP_SYS_PTRACE, hidden by
 * hidepid or ProtectProc=invisible) is neither; *unreadable (optional) counts
 * the ones seen but not read. Cost: one pass over /proc reading every readable
 * process's status and maps, and one readlink per open fd (fstat only for
 * names that match). Returns 0, or -errno when <proc_root>/proc cannot be opened.
 */
int holders_scan_memfds(const char *proc_root, const char *name, holders_memfd_fn *on_memfd, holders_read_fn *on_read,
			void *ud, size_t *unreadable);

/* Whether to read process pid, whose real uid (the Uid: line of /proc/PID/status) is uid. */
typedef bool holders_want_fn(pid_t pid, uid_t uid, void *ud);

/*
 * holders_scan_memfds, reading only the processes want (NULL: all) says yes
 * to: a process skipped is neither reported nor counted unreadable.
 */
int holders_scan_memfds_of(const char *proc_root, const char *name, holders_want_fn *want, holders_memfd_fn *on_memfd,
			   holders_read_fn *on_read, void *ud, size_t *unreadable);

/*
 * The same scan in slices, resumable within one process: a process with 65,000
 * mappings and 20,000 fds is read over many steps (one read() of its maps, or
 * 16 of its fds, between two looks at the clock), so no step runs much past
 * its budget. Each (dev, inode) is stat'ed once per scan: a mapping of a file
 * already seen costs no syscall. want (NULL: every process) is asked with the
 * process's real, effective, saved and fs uid from /proc/PID/status, never the
 * directory's owner (root's for a process that is not dumpable).
 */
typedef bool holders_want_uids_fn(pid_t pid, const uid_t ids[4], void *ud);
struct holders_memfd_scan;
struct holders_memfd_stats {
	size_t processes;  /* read (wanted) */
	size_t unreadable; /* seen but not readable */
	size_t stats;      /* fstatat calls made on memfds of the name */
	size_t lines;      /* maps lines read */
	size_t slices;     /* steps that did work */
};
/* Returns 0 and *ret, -ENAMETOOLONG, -ENOMEM, or -errno when <proc_root>/proc cannot be opened. */
int holders_memfd_scan_new(const char *proc_root, const char *name, holders_want_uids_fn *want,
			   holders_memfd_fn *on_memfd, holders_read_fn *on_read, void *ud,
			   struct holders_memfd_scan **ret);
/* Work until budget_us has passed (at least one unit). Returns 1 once the pass is complete, else 0. */
int holders_memfd_scan_step(struct holders_memfd_scan *s, uint64_t budget_us);
void holders_memfd_scan_stats(const struct holders_memfd_scan *s, struct holders_memfd_stats *ret);
/* NULL is fine. */
void holders_memfd_scan_free(struct holders_memfd_scan *s);

/* Close every pidfd and free the array. NULL is fine. */
void holders_free(struct holder *h, size_t n);
