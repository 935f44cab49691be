/* SPDX-License-Identifier: MIT */
/* pinbrokerd's configuration: one key table feeds the parser, validation, --help, and the sample config. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>

#include "settings.h" /* enum config_enforce, enum config_job_unknown */

#define CONFIG_DEFAULT_PATH "/etc/pinbroker/pinbrokerd.conf"
/*
 * Where an installed daemon's config lives, as the install rules put it (systemd/CMakeLists.txt), set by CMake:
 * CONFIG_SBINDIR and CONFIG_SYSCONFDIR as GNUInstallDirs names them (relative to the prefix, or absolute), and
 * CONFIG_CONFDIR the folder PINBROKER_CONFDIR forces ("" when it is not set).
 */
#ifndef CONFIG_SBINDIR
#define CONFIG_SBINDIR "sbin"
#endif
#ifndef CONFIG_SYSCONFDIR
#define CONFIG_SYSCONFDIR "etc"
#endif
#ifndef CONFIG_CONFDIR
#define CONFIG_CONFDIR ""
#endif
/* Room for the key table's rows in struct config's origin array (a static assert checks it). */
#define CONFIG_MAX_KEYS 64
#define CONFIG_ORIGIN_SET UINT_MAX
#define CONFIG_ORIGIN_RUNTIME (UINT_MAX - 1) /* pinctl set: kept over the file on reload until restart */
#define CONFIG_ORIGIN_ENV (UINT_MAX - 2)     /* $PINBROKER_SOCKET */

/* Where a key's running value came from, as pinctl get and pinctl config show it. */
enum config_source {
	CONFIG_SOURCE_DEFAULT,      /* the embedded default */
	CONFIG_SOURCE_FILE,         /* a line of the config file */
	CONFIG_SOURCE_ENVIRONMENT,  /* $PINBROKER_SOCKET */
	CONFIG_SOURCE_COMMAND_LINE, /* --KEY VALUE */
	CONFIG_SOURCE_SET,          /* pinctl set at run time: kept over the file on reload until restart */
};

enum config_hugetlb { CONFIG_HUGETLB_AUTO, CONFIG_HUGETLB_YES, CONFIG_HUGETLB_NO };
enum config_thp { CONFIG_THP_AUTO, CONFIG_THP_YES, CONFIG_THP_NO };
enum config_numa { CONFIG_NUMA_AUTO, CONFIG_NUMA_NO };
/* Whose client and lease rows STATUS shows a non-admin (admins always see every row). */
enum config_visibility { VISIBILITY_OWN, VISIBILITY_ALL };
/* Who gets the metrics' per-uid and per-job series (metrics-detail): every client, admins only, or nobody. */
enum config_metrics_detail { METRICS_DETAIL_ALL, METRICS_DETAIL_ADMIN, METRICS_DETAIL_NONE };

/* A size written as bytes ("4G") or as a share of something ("25%"). */
struct size_spec {
	uint64_t bytes;
	double pct;
	bool is_pct;
};

struct config {
	char *socket_path;                      /* socket */
	struct size_spec budget;                /* budget: of MemTotal or the cgroup limit if lower */
	struct size_spec uid_quota;             /* uid-quota: of the budget */
	struct size_spec prewarm;               /* prewarm: of the budget */
	struct size_spec max_no_revoke_per_uid; /* max-no-revoke-per-uid: of the uid quota */
	uint64_t chunk_bytes;                   /* chunk-size */
	uint64_t chunk_max_bytes;               /* chunk-max */
	enum config_hugetlb hugetlb;            /* hugetlb */
	enum config_thp thp;                    /* thp */
	enum config_numa numa;                  /* numa */
	char *numa_prewarm;                     /* numa-prewarm: gpus, even, or NODE:SIZE,... */
	char *job_quota;                        /* job-quota: CGROUP:SIZE entries, "" = none */
	enum config_job_unknown job_unknown;    /* job-unknown */
	char *metrics_path;                     /* metrics-path: "" = no metrics file */
	uint32_t metrics_interval_ms;           /* metrics-interval-ms */
	uint64_t prewarm_before_ready_bytes;    /* prewarm-before-ready: start warm-up done before READY */
	uint64_t warmup_batch_max_bytes;        /* warmup-batch-max: a warm-up batch (at least a chunk) */
	unsigned prewarm_threads;               /* prewarm-threads: 0 = CPUs */
	uint32_t pool_shrink_delay_ms;          /* pool-shrink-delay-ms: idle time before shrinking to prewarm */
	char *admin_group;                      /* admin-group: "" = root only */
	int log_level;                          /* log-level: syslog level */
	char *proc_root;                        /* proc-root: where /proc and /sys/fs/cgroup are read */
	bool lock_memory; /* lock-memory: mlock the pool (off only for tests without CAP_IPC_LOCK) */

	/* limits */
	uint32_t max_connections;           /* max-connections */
	uint32_t max_connections_per_uid;   /* max-connections-per-uid */
	uint32_t handshake_timeout_ms;      /* handshake-timeout-ms */
	uint32_t max_leases_per_client;     /* max-leases-per-client */
	uint32_t max_leases_per_uid;        /* max-leases-per-uid: 0 = derived */
	uint32_t max_chunks_per_uid;        /* max-chunks-per-uid: 0 = derived from RLIMIT_NOFILE and max_map_count */
	uint32_t max_registrants_per_file;  /* max-registrants-per-file */
	uint32_t max_reservations_per_uid;  /* max-reservations-per-uid */
	uint32_t reserve_fds;               /* reserve-fds */
	uint64_t max_queued_bytes_per_conn; /* max-queued-bytes-per-connection */
	uint64_t max_queued_bytes;          /* max-queued-bytes: all connections together */
	uint32_t max_pending_acquires;      /* max-pending-acquires */
	uint32_t max_message_bytes;         /* max-message-bytes */
	uint32_t acquire_timeout_ms;        /* acquire-timeout-ms: default wait for ACQUIRE_FLAG_WAIT */
	enum config_visibility status_visibility;  /* status-visibility */
	enum config_metrics_detail metrics_detail; /* metrics-detail */

	/* pressure policy */
	double tight_mem_available_pct;     /* tight-mem-available-pct */
	double critical_mem_available_pct;  /* critical-mem-available-pct */
	double tight_psi_some_avg10;        /* tight-psi-some-avg10 */
	double critical_psi_full_avg10;     /* critical-psi-full-avg10 */
	double tight_swapout_pages_s;       /* tight-swapout-pages-per-s */
	double critical_swapout_pages_s;    /* critical-swapout-pages-per-s */
	double tight_swap_free_pct;         /* tight-swap-free-pct */
	uint32_t hysteresis_ms;             /* hysteresis-ms: time below a threshold before leaving a state */
	uint32_t poll_interval_ms;          /* poll-interval-ms */
	uint32_t psi_window_ms;             /* psi-window-ms */
	uint32_t psi_stall_ms;              /* psi-stall-ms: stall within the window that fires a trigger */
	uint32_t revoke_deadline_ms;        /* revoke-deadline-ms */
	uint32_t revoke_min_deadline_ms;    /* revoke-min-deadline-ms: floor of a non-admin's own revoke */
	uint32_t enforce_slice_us;          /* enforce-slice-us: enforcement time per loop turn */
	enum config_enforce revoke_enforce; /* revoke-enforce */

	/* service */
	char *restart_state;         /* restart-state: the file a clean stop leaves ("": the default place) */
	uint32_t orphan_rescan_ms;   /* orphan-rescan-ms: how often what a previous daemon lent is checked */
	uint32_t redeclare_grace_ms; /* redeclare-grace-ms: after a restart, wait this long for clients */

	/*
	 * Where each key's value came from, by its index in the table: 0 is the
	 * embedded default, CONFIG_ORIGIN_SET a config_set call (the command line,
	 * pinctl set), anything else the config file line. An embedded default
	 * yields to a value the user set (prewarm to a smaller budget); two values
	 * the user set that conflict are an error.
	 */
	unsigned origin[CONFIG_MAX_KEYS];
	char *file_path; /* the file config_load_file last read into this config, or NULL */
};

enum config_type { CT_STRING, CT_SIZE, CT_SIZE_PCT, CT_UINT, CT_DOUBLE, CT_BOOL, CT_ENUM, CT_LOGLEVEL };

struct config_key {
	const char *name;
	enum config_type type;
	double min, max;            /* for numbers and sizes */
	const char *def;            /* the embedded default, as text */
	const char *help;           /* one line */
	const char *const *choices; /* CT_ENUM: NULL-terminated */
	bool reloadable;            /* applied on SIGHUP; others need a restart */
	size_t offset;              /* into struct config */
};

/* The table, in the order the sample config lists it. */
const struct config_key *config_keys(size_t *n);
const struct config_key *config_key_find(const char *name);
/* The key closest to name when it is close enough to be a typo ("bugdet": "budget"), else NULL. */
const char *config_suggest_key(const char *name);

/* A config holding every embedded default. Returns 0 and *ret, or -ENOMEM. */
int config_new(struct config **ret);
/*
 * The config file a daemon at exe (its own path, /proc/self/exe) reads when --config is not given: PREFIX/etc/
 * pinbroker/pinbrokerd.conf for exe = PREFIX/sbin/pinbrokerd (`cmake --install --prefix PREFIX` writes it there,
 * whatever prefix the build was configured with), CONFIG_DEFAULT_PATH for prefix /usr or / and for a daemon run
 * from anywhere else (a build tree). Pure: no file is looked at. 0, or -ENAMETOOLONG where out is too small.
 */
int config_default_path_for(const char *exe, char *out, size_t len);
void config_free(struct config *c);
/* Deep copy. Returns 0 or -ENOMEM. */
int config_dup(const struct config *c, struct config **ret);

/*
 * Set one key from text. Returns 0, or -ENOENT (unknown key), -EINVAL/-ERANGE
 * (bad value) with *err set to a malloc'd message without location ("budget:
 * '12Q' is not a size; use a number with K, M, G or T, or a percentage").
 */
int config_set(struct config *c, const char *key, const char *value, char **err);

/*
 * Read a file of "key = value" lines ('#' starts a comment, blank lines are
 * fine) into c. Every error is collected as "path:line: message\n" in *err
 * (malloc'd); the return is then -EINVAL and c may be partly updated, so
 * parse into a copy (config_dup) and swap on success. A missing file returns
 * -ENOENT with *err saying so. Returns 0 on success.
 */
int config_load_file(struct config *c, const char *path, char **err);

/*
 * sshd's StrictModes, as a warning: the config file, and every folder above
 * it, should be changeable only by root or the daemon's euid. A regular file
 * that another uid owns or that group or others may write, or a folder like
 * that (a sticky one, as /tmp, may be writable), gets one line each in *warn
 * (malloc'd, "path: what is wrong; what to run\n"); *warn is NULL when all is
 * well. Anything that is not a regular file (/dev/null) is not checked.
 * Returns 0, or a negative errno when path cannot be resolved (*warn NULL).
 */
int config_check_file_mode(const char *path, char **warn);

/*
 * Cross-key checks (critical below tight, ...). Returns 0 or -EINVAL with *err,
 * one message a line; a message about a key set in the file starts with
 * "path:line: " (path is the file's name, or NULL to leave locations out).
 * A prewarm left at its embedded default is not checked against the budget:
 * it yields (see config_prewarm_yields).
 */
int config_validate(const struct config *c, char **err);
int config_validate_file(const struct config *c, const char *path, char **err);

/* Whether key's value was set by the user (the file, the command line or pinctl set), not embedded. */
bool config_is_user_set(const struct config *c, const char *key);

/*
 * True when prewarm is its embedded default and above a budget written as a
 * size: the pool then warms only the budget, and the caller says so once.
 */
bool config_prewarm_yields(const struct config *c);

/*
 * Where k's value in c came from; for CONFIG_SOURCE_FILE, *line (if line is
 * not NULL) gets its line in config_file_path(c), else 0.
 */
enum config_source config_source_of(const struct config *c, const struct config_key *k, unsigned *line);
/* "default", "file", "environment", "command line" or "set". */
const char *config_source_name(enum config_source s);
/* The file config_load_file read into c (kept by config_dup), or NULL when none was. */
const char *config_file_path(const struct config *c);
/* Mark key as set from the environment ($PINBROKER_SOCKET). Returns 0 or -ENOENT. */
int config_mark_env(struct config *c, const char *key);
/* k's value in c as config text, as the config file spells it ("8G", "25%", "yes"); buf of len bytes. */
void config_format_value(const struct config *c, const struct config_key *k, char *buf, size_t len);

/* Mark key as set at run time (pinctl set), so a reload keeps it. Returns 0 or -ENOENT. */
int config_mark_runtime(struct config *c, const char *key);

/*
 * Copy every key src marks as set at run time into dst, with the mark; for
 * each, call note (if set) with the key and its value as config text, so the
 * caller can say it overrides the file. Returns 0 or -ENOMEM.
 */
int config_keep_runtime(struct config *dst, const struct config *src,
			void (*note)(const char *key, const char *value, void *ud), void *ud);

/*
 * Copy into dst, from src, the value of every key the table marks not
 * reloadable whose value differs: a reload keeps what was set up at start.
 * For each, call note (if set) with the key, the value dst asked for and the
 * value kept, as config text. Returns 0 or -ENOMEM.
 */
int config_keep_fixed(struct config *dst, const struct config *src,
		      void (*note)(const char *key, const char *wanted, const char *kept, void *ud), void *ud);

/* Whether k has the same value in a and b, compared as config text. */
bool config_key_equal(const struct config *a, const struct config *b, const struct config_key *k);

/* Write the commented sample config (every key, its default and help). */
void config_write_sample(FILE *f);
/* Write a markdown table of every key (key | default | reloadable | meaning), for the README. */
void config_write_markdown(FILE *f);
/* Write the pinbrokerd.conf(5) man page (man macros): the file format and every key, from the same table. */
void config_write_man(FILE *f);
/* Write the effective config as "key = value" lines. */
void config_dump(const struct config *c, FILE *f);

/* The values of c the core decides with (core/settings.h). */
void config_settings(const struct config *c, struct broker_settings *ret);

/* Resolve a size_spec against a base (for percentages). */
uint64_t config_resolve(const struct size_spec *s, uint64_t base);

const char *config_enforce_name(enum config_enforce e);
