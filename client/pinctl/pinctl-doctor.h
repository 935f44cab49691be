/* SPDX-License-Identifier: MIT */
/*
 * What pinctl doctor's three files share: the findings and what the checks read once. pinctl-doctor.c
 * (the command and its output) calls pinctl-doctor-checks.c (the checks), and both call
 * pinctl-doctor-gather.c (reading the host's files, the daemon, the driver; recording findings).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The host's /proc and /sys files are read under this folder when set (tests' fixture roots). */
#define DOCTOR_ROOT_ENV "PINBROKER_DOCTOR_ROOT"
#define TEXT_BYTES 640

enum doctor_status { DOCTOR_OK, DOCTOR_WARN, DOCTOR_FAIL, DOCTOR_SKIP };

struct finding {
	const char *name;
	enum doctor_status status;
	char message[TEXT_BYTES];
	char fix[TEXT_BYTES];
};

/* What the checks share, gathered once: the daemon, its status, the driver. */
struct doctor {
	const char *root; /* PINBROKER_DOCTOR_ROOT, "" for the real / */
	const char *socket;
	int connect_err; /* 0, or the negative errno of pb_connect */
	char connect_msg[256];
	bool have_status;
	uint64_t budget_bytes;
	uint64_t chunk_size_bytes, chunk_max_bytes, chunk_capacity; /* the pool's chunk classes and their room */
	char page_kind[16];
	char cgroup_ns[16];       /* pb_status_cgroup_namespace: "" from an older daemon */
	char cgroup_ns_root[512]; /* its root in the host's tree, where "private" */
	char restart_books[16];   /* pb_status_restart_warning: "" from an older daemon */
	char restart_warning[TEXT_BYTES];
	pid_t daemon_pid;             /* 0 when not found */
	uint32_t job_unknown_clients; /* pb_status_job_unknown: clients whose job the daemon could not read */
	uint64_t job_unknown_total;   /* and their acquires while quota rules existed */
	bool cuda_loaded;
	bool cuda_usable;
	int driver_version;
	int gpus;
	uint64_t gpu_bytes; /* every GPU's memory together */
	char cuda_msg[256];
	struct finding findings[24];
	size_t n;
};

/* A finding of check name (a fixed string) with its message; its fix is empty until doctor_fix. */
__attribute__((format(printf, 4, 5))) struct finding *doctor_add(struct doctor *d, const char *name,
								 enum doctor_status st, const char *fmt, ...);
/* What to do about finding f. */
__attribute__((format(printf, 2, 3))) void doctor_fix(struct finding *f, const char *fmt, ...);
/* path under the fixture root into buf, which it returns (host-wide files only; a process's own are from /proc). */
const char *doctor_rooted(const struct doctor *d, const char *path, char *buf, size_t len);
/* The whole of a small file, NUL-terminated, into buf. Returns its length, or -errno. */
ssize_t doctor_read_text(const char *path, char *buf, size_t len);
/* The number after "key:" on a line of a meminfo or status style file. Returns 0, or -ENOENT. */
int doctor_field_u64(const char *text, const char *key, int base, uint64_t *ret);
/* A /proc/meminfo kB figure in bytes. Returns 0, or -ENOENT. */
int doctor_meminfo_bytes(const struct doctor *d, const char *key, uint64_t *ret);
/* Fill d once, before the checks: the fixture root, the socket, the daemon's status and pid, the driver. */
void doctor_gather(struct doctor *d);

/* Whether the socket check failed because no daemon answers (nothing listens, or no HELLO in time). */
bool doctor_no_daemon(const struct doctor *d);

/* Every check in order, each adding its finding to d (pinctl-doctor-checks.c). */
void doctor_checks_run(struct doctor *d);
