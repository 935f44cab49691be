/* SPDX-License-Identifier: MIT */
/*
 * pinbrokerd's key table: every key's name, type, bounds, embedded default, one line of help, and whether a
 * reload applies it. The parser, the validation, pinctl config and the docs all read this one table
 * (config-int.h says who calls whom). Also the lookups by name, with a typo's nearest key.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config-int.h"

/* Ceiling for connection and lease counts: far above real use, low enough to catch typos. */
#define COUNT_MAX 1048576.0
/* Ceiling for timeouts and delays: an hour; longer means a typo more often than a wish. */
#define HOUR_MS 3600000.0

static const char *const hugetlb_choices[] = { "auto", "yes", "no", NULL };
static const char *const enforce_choices[] = { "none", "disconnect", "sigterm", "sigkill", NULL };
static const char *const visibility_choices[] = { "own", "all", NULL };
static const char *const metrics_detail_choices[] = { "all", "admin", "none", NULL };
static const char *const numa_choices[] = { "auto", "no", NULL };
static const char *const job_unknown_choices[] = { "refuse", "allow", NULL };

/* Enum values are indexes into their choices arrays. */
_Static_assert(CONFIG_HUGETLB_AUTO == 0 && CONFIG_HUGETLB_YES == 1 && CONFIG_HUGETLB_NO == 2, "hugetlb_choices order");
_Static_assert(CONFIG_THP_AUTO == 0 && CONFIG_THP_YES == 1 && CONFIG_THP_NO == 2, "hugetlb_choices order (thp)");
_Static_assert(ENFORCE_NONE == 0 && ENFORCE_DISCONNECT == 1 && ENFORCE_SIGTERM == 2 && ENFORCE_SIGKILL == 3,
	       "enforce_choices order");
_Static_assert(VISIBILITY_OWN == 0 && VISIBILITY_ALL == 1, "visibility_choices order");
_Static_assert(METRICS_DETAIL_ALL == 0 && METRICS_DETAIL_ADMIN == 1 && METRICS_DETAIL_NONE == 2,
	       "metrics_detail_choices order");
_Static_assert(CONFIG_NUMA_AUTO == 0 && CONFIG_NUMA_NO == 1, "numa_choices order");
_Static_assert(JOB_UNKNOWN_REFUSE == 0 && JOB_UNKNOWN_ALLOW == 1, "job_unknown_choices order");

/*
 * The offset macros check at compile time that each field has the C type its
 * config type is stored as, so a table row can't write through the wrong width.
 */
#define FIELD(f) (((struct config *)0)->f)
#define OFF_CHECKED(f, ok)                                                                  \
	(offsetof(struct config, f) + 0 * sizeof(struct {                                   \
					      _Static_assert(ok, #f " has the wrong type"); \
					      int x;                                        \
				      }))
#define OFF_STRING(f) OFF_CHECKED(f, __builtin_types_compatible_p(__typeof__(FIELD(f)), char *))
#define OFF_SIZE(f) OFF_CHECKED(f, __builtin_types_compatible_p(__typeof__(FIELD(f)), uint64_t))
#define OFF_SPEC(f) OFF_CHECKED(f, __builtin_types_compatible_p(__typeof__(FIELD(f)), struct size_spec))
#define OFF_UINT(f) OFF_CHECKED(f, __builtin_types_compatible_p(__typeof__(FIELD(f)), uint32_t))
#define OFF_DOUBLE(f) OFF_CHECKED(f, __builtin_types_compatible_p(__typeof__(FIELD(f)), double))
#define OFF_BOOL(f) OFF_CHECKED(f, __builtin_types_compatible_p(__typeof__(FIELD(f)), bool))
#define OFF_INT(f) OFF_CHECKED(f, sizeof(FIELD(f)) == sizeof(int))

#define K_STRING(n, f, d, rl, h)                                                                             \
	{                                                                                                    \
		.name = n, .type = CT_STRING, .def = d, .help = h, .reloadable = rl, .offset = OFF_STRING(f) \
	}
#define K_SIZE(n, f, lo, hi, d, rl, h)                                                                   \
	{                                                                                                \
		.name = n, .type = CT_SIZE, .min = lo, .max = hi, .def = d, .help = h, .reloadable = rl, \
		.offset = OFF_SIZE(f)                                                                    \
	}
#define K_SPEC(n, f, d, rl, h)                                                                            \
	{                                                                                                 \
		.name = n, .type = CT_SIZE_PCT, .min = 0, .max = (double)UINT64_MAX, .def = d, .help = h, \
		.reloadable = rl, .offset = OFF_SPEC(f)                                                   \
	}
#define K_UINT(n, f, lo, hi, d, rl, h)                                                                   \
	{                                                                                                \
		.name = n, .type = CT_UINT, .min = lo, .max = hi, .def = d, .help = h, .reloadable = rl, \
		.offset = OFF_UINT(f)                                                                    \
	}
#define K_DOUBLE(n, f, lo, hi, d, rl, h)                                                                   \
	{                                                                                                  \
		.name = n, .type = CT_DOUBLE, .min = lo, .max = hi, .def = d, .help = h, .reloadable = rl, \
		.offset = OFF_DOUBLE(f)                                                                    \
	}
#define K_BOOL(n, f, d, rl, h)                                                                           \
	{                                                                                                \
		.name = n, .type = CT_BOOL, .def = d, .help = h, .reloadable = rl, .offset = OFF_BOOL(f) \
	}
#define K_ENUM(n, f, ch, d, rl, h)                                                                                     \
	{                                                                                                              \
		.name = n, .type = CT_ENUM, .def = d, .help = h, .choices = ch, .reloadable = rl, .offset = OFF_INT(f) \
	}
#define K_LOGLEVEL(n, f, d, rl, h)                                                                          \
	{                                                                                                   \
		.name = n, .type = CT_LOGLEVEL, .def = d, .help = h, .reloadable = rl, .offset = OFF_INT(f) \
	}

/*
 * Reloadable keys are the ones the running daemon can re-read without
 * rebuilding what it set up at start: the socket, the pool's memfds and
 * threads, where /proc is, and the PSI triggers are all made once.
 */
const struct config_key config_key_table[] = {
	K_STRING("socket", socket_path, "/run/pinbroker/pinbroker.sock", false,
		 "Path of the listening socket (an absolute path; ignored under socket activation)."),
	K_SPEC("budget", budget, "25%", true,
	       "Most memory lent at once: a size, or a percentage of MemTotal (or of the cgroup memory limit if "
	       "lower)."),
	K_SPEC("uid-quota", uid_quota, "100%", true,
	       "Most memory one uid may hold: a size, or a percentage of the budget."),
	K_SPEC("max-no-revoke-per-uid", max_no_revoke_per_uid, "50%", true,
	       "Most memory one uid may hold in leases that are never revoked (pb_register charges, "
	       "PB_ACQUIRE_NO_REVOKE "
	       "leases): a size, or a percentage of the uid quota. Only the holder's exit frees such memory, so past "
	       "this they are refused; 0 refuses them all."),
	K_SPEC("prewarm", prewarm, "256M", true,
	       "Locked memory kept warm in the pool while idle: a size, or a percentage of the budget."),
	K_SIZE("chunk-size", chunk_bytes, (double)(4 * KIB), (double)GIB, "2M", false,
	       "Size of the smallest pool memfd (a multiple of 4K; of 2M with hugetlb = yes); leases are made of whole "
	       "chunks."),
	K_SIZE("chunk-max", chunk_max_bytes, (double)(4 * KIB), (double)(64 * GIB), "1G", false,
	       "Largest pool memfd: chunks come in classes chunk-size * 2^k up to this, and a lease is made of the "
	       "fewest of them (largest first), so its fds and mappings grow with the log of its size. Raised at start "
	       "when the budget would not fit the fd limit and vm.max_map_count; chunk-size or below: one class."),
	K_ENUM("hugetlb", hugetlb, hugetlb_choices, "auto", false,
	       "Back the pool with 2 MiB huge pages: auto uses them when the host has them free."),
	K_ENUM("thp", thp, hugetlb_choices, "auto", false,
	       "Collapse 4 KiB pool chunks into transparent huge pages (MADV_COLLAPSE, Linux 6.1+; no reservation "
	       "needed): auto where the kernel can, yes or refuse to start, no. Used when the pool is not on "
	       "hugetlb, and when huge pages run out."),
	K_ENUM("numa", numa, numa_choices, "auto", false,
	       "Place pool chunks on NUMA nodes (mbind before any page is faulted, checked with move_pages) and "
	       "lease each client memory on its GPU's node: auto, or no to let the kernel place pages."),
	K_STRING("numa-prewarm", numa_prewarm, "gpus", false,
		 "How prewarm is spread over NUMA nodes: gpus (in proportion to each node's GPUs; even when none "
		 "says its node), even, or NODE:SIZE,... (for example 0:8G,1:8G)."),
	/*
	 * 1 GiB, the bound that was a constant: warm before READY in under a second at memory speed, so a small pool
	 * is whole from the first request; a bigger one would hold READY (and systemd's start timeout) for as long as
	 * faulting it takes. 1024T: far above any host, a size that still means "always before READY".
	 */
	K_SIZE("prewarm-before-ready", prewarm_before_ready_bytes, 0, (double)(UINT64_C(1) << 50), "1G", false,
	       "Largest start warm-up finished before the daemon says it is ready; a bigger prewarm warms beside the "
	       "event loop while the daemon serves from the part already warm (pinctl status: pool_warming). 0: "
	       "always beside the loop; a size at or above prewarm: always before ready."),
	/*
	 * 16 GiB, the bound that was a constant: a chunk of 1 GiB (the default largest class) for each of the 16
	 * warm-up threads of an H100 host, so a batch keeps every thread on a chunk of its own. 2M (a huge page,
	 * the default smallest chunk) at least: a batch always holds one chunk, so a smaller cap would mean the same.
	 */
	K_SIZE("warmup-batch-max", warmup_batch_max_bytes, (double)(2 * MIB), (double)(UINT64_C(1) << 50), "16G", false,
	       "Most memory a start warm-up beside the loop pins before the daemon counts it: the warm-up makes a "
	       "batch of chunks (one for each prewarm thread, at least 1 GiB, at most this) and makes the next only "
	       "once the pool has taken it in. A batch always holds one chunk, so below the largest chunk (chunk-max) "
	       "the warm-up goes a chunk at a time. Lower it where memory outside the books matters more than warm-up "
	       "speed (fewer chunks filled at once)."),
	K_UINT("prewarm-threads", prewarm_threads, 0, 64, "0", false,
	       "Threads that fault in the pool at start, a chunk each (a chunk split into segments only when there are "
	       "fewer chunks than threads); 0 means one per core the daemon may run on (its affinity), at most 32."),
	K_UINT("pool-shrink-delay-ms", pool_shrink_delay_ms, 0, (double)UINT32_MAX, "30000", true,
	       "Idle time before the pool shrinks back to the prewarm size."),
	K_STRING("admin-group", admin_group, "", true,
		 "Group whose members may run admin requests (other uids' leases, the budget); empty means root only. "
		 "Root and members are admins only from the daemon's own pid and user namespaces."),
	K_STRING(
		"job-quota", job_quota, "", true,
		"Per-job quotas: CGROUP:SIZE entries apart by blanks, CGROUP a cgroup path whose components may be "
		"globs, SIZE bytes or a share of the budget (/kubepods.slice/kubepods-burstable.slice/*:16G gives each "
		"burstable pod 16G); see "
		"pinctl quota."),
	K_ENUM("job-unknown", job_unknown, job_unknown_choices, "refuse", true,
	       "What an acquire gets while job quota rules exist (job-quota, pinctl quota set) and the daemon could "
	       "not read its client's cgroup (/proc/PID/cgroup hidden or unreadable, or outside an unresolved cgroup "
	       "namespace): refuse (the default: no job is silently unlimited) or allow (charged to no job, "
	       "unlimited by the rules). Either way it is logged at warning, counted (pinctl status, "
	       "pinbroker_job_unknown_total) and flagged by pinctl doctor."),
	K_STRING("metrics-path", metrics_path, "", true,
		 "Prometheus text file the daemon rewrites atomically every metrics-interval-ms, for node_exporter's "
		 "textfile collector (for example /var/lib/prometheus/node-exporter/pinbroker.prom); empty: none."),
	K_UINT("metrics-interval-ms", metrics_interval_ms, 1000, HOUR_MS, "15000", true,
	       "How often metrics-path is rewritten."),
	K_ENUM("metrics-detail", metrics_detail, metrics_detail_choices, "all", true,
	       "Who gets the metrics' per-uid and per-job series (pinbroker_uid_leased_bytes{uid,user}, "
	       "pinbroker_job_leased_bytes, _job_leases and _job_quota_bytes{cgroup}): all (every client that "
	       "asks, pinctl metrics and the HTTP endpoint, and metrics-path: the dashboard's per-user and per-job "
	       "panels need them), admin (only admins, or every client under status-visibility = all; metrics-path "
	       "keeps them) or none (nowhere: no user names or cgroup paths reach Prometheus). One series per uid "
	       "and per job holding leases now (a job with a quota rule too), so their number follows the host's "
	       "jobs, not its history."),
	K_LOGLEVEL("log-level", log_level, "info", true,
		   "Least severe messages logged: debug, info, notice, warning or err."),
	K_STRING("proc-root", proc_root, "/", false,
		 "Directory under which /proc and /sys/fs/cgroup are read (tests point it at fixtures)."),
	K_BOOL("lock-memory", lock_memory, "yes", false,
	       "mlock the pool; turn off only for tests run without CAP_IPC_LOCK."),

	K_UINT("max-connections", max_connections, 1, COUNT_MAX, "1024", true, "Most client connections at once."),
	K_UINT("max-connections-per-uid", max_connections_per_uid, 1, COUNT_MAX, "256", true,
	       "Most client connections one uid may hold at once."),
	K_UINT("handshake-timeout-ms", handshake_timeout_ms, 1, HOUR_MS, "5000", true,
	       "Time a new connection has to send HELLO before it is closed."),
	K_UINT("max-leases-per-client", max_leases_per_client, 1, COUNT_MAX, "4096", true,
	       "Most leases one connection may hold."),
	K_UINT("max-leases-per-uid", max_leases_per_uid, 0, COUNT_MAX, "0", true,
	       "Most leases one uid may hold over all its connections; 0 derives it from the daemon's limits "
	       "(as max-chunks-per-uid)."),
	K_UINT("max-chunks-per-uid", max_chunks_per_uid, 0, COUNT_MAX, "0", true,
	       "Most pool chunks (each one file descriptor, and one mapping without hugetlb, in the daemon) one uid "
	       "may hold; 0 means half of what the daemon's RLIMIT_NOFILE and vm.max_map_count allow."),
	/* The cost of a registration of a shared file grows with the square of its registrants (backing.h). */
	K_UINT("max-registrants-per-file", max_registrants_per_file, 0, 4096, "256", true,
	       "Registrations of one shared file (the same pages registered by several processes, as the ranks of one "
	       "server do) charged once; past this many, a further registration of the file is charged in full, as "
	       "private memory is. 0 charges every registration in full."),
	/* 1024: RESERVATIONS_MAX (core/reservation.h), the host-wide table's size. */
	K_UINT("max-reservations-per-uid", max_reservations_per_uid, 1, 1024, "16", true,
	       "Most reservations (pb_reserve) one uid may hold alive at once, joins not counted, admins included; "
	       "the host holds 1024 at most, so one uid cannot take them all and starve other jobs' reserves."),
	K_UINT("reserve-fds", reserve_fds, 16, COUNT_MAX, "64", false,
	       "File descriptors (and mappings) kept free of leases, so an admin connection always works."),
	K_SIZE("max-queued-bytes-per-connection", max_queued_bytes_per_conn, 4 * 1024, (double)(1ull << 40), "1M", true,
	       "Reply bytes queued for a client that does not read them before it is disconnected."),
	K_SIZE("max-queued-bytes", max_queued_bytes, 4 * 1024, (double)(1ull << 40), "64M", true,
	       "Reply bytes queued for all slow clients together; past it the client with the most is disconnected."),
	K_UINT("max-pending-acquires", max_pending_acquires, 0, COUNT_MAX, "256", true,
	       "Most ACQUIRE requests waiting for memory at once, host-wide; 0 refuses instead of waiting."),
	K_UINT("max-message-bytes", max_message_bytes, 256, 1048576, "65536", false,
	       "Largest request packet accepted; a larger one closes the connection."),
	K_UINT("acquire-timeout-ms", acquire_timeout_ms, 0, HOUR_MS, "10000", true,
	       "How long a waiting ACQUIRE waits for memory when the client gives no timeout."),
	K_ENUM("status-visibility", status_visibility, visibility_choices, "own", true,
	       "Whose client and lease rows (pids, labels, names) a non-admin sees in status: own (its uid's, taken "
	       "from its own pid namespace) or all. own by default: labels are free text that may name jobs and data, "
	       "and which uid runs what "
	       "is no other member's business (least privilege); budget, leased and pressure figures stay visible "
	       "to all, and admins always see every row."),

	/*
	 * MemAvailable and PSI figures: systemd-oomd acts at 60% PSI over 20 s;
	 * ours act earlier because revoking pinned memory is cheap next to
	 * killing a job.
	 */
	K_DOUBLE("tight-mem-available-pct", tight_mem_available_pct, 0, 100, "10", true,
		 "Tight when MemAvailable falls below this share of MemTotal; 0 turns the signal off."),
	K_DOUBLE("critical-mem-available-pct", critical_mem_available_pct, 0, 100, "5", true,
		 "Critical when MemAvailable falls below this share of MemTotal; 0 turns the signal off."),
	K_DOUBLE("tight-psi-some-avg10", tight_psi_some_avg10, 0, 100, "10", true,
		 "Tight when PSI memory 'some' avg10 (percent) rises above this; 0 turns the signal off."),
	K_DOUBLE("critical-psi-full-avg10", critical_psi_full_avg10, 0, 100, "5", true,
		 "Critical when PSI memory 'full' avg10 (percent) rises above this; 0 turns the signal off."),
	K_DOUBLE("tight-swapout-pages-per-s", tight_swapout_pages_s, 0, 1e9, "1000", true,
		 "Tight when pages swapped out per second rise above this; 0 turns the signal off."),
	K_DOUBLE("critical-swapout-pages-per-s", critical_swapout_pages_s, 0, 1e9, "10000", true,
		 "Critical when pages swapped out per second rise above this; 0 turns the signal off."),
	K_DOUBLE("tight-swap-free-pct", tight_swap_free_pct, 0, 100, "20", true,
		 "Tight when free swap falls below this share of swap (counts only when swap exists); 0 turns the "
		 "signal off."),
	K_UINT("hysteresis-ms", hysteresis_ms, 0, HOUR_MS, "5000", true,
	       "Time every signal must stay below a state's thresholds before the daemon leaves that state."),
	/*
	 * 100 ms: a MemAvailable drop with no PSI event reaches REVOKE in p99
	 * 96-108 ms (bench_pressure; the target is <= 100). Idle on the 2-CPU
	 * development VM this costs 0.12-0.16% of a core (target 0.1), where a bare
	 * 10 Hz wake-up alone costs 0.05-0.08%: no interval meets both there.
	 */
	K_UINT("poll-interval-ms", poll_interval_ms, 50, HOUR_MS, "100", true,
	       "How often meminfo, vmstat and the cgroup are sampled (PSI triggers wake the daemon sooner)."),
	/* The kernel takes PSI windows of 500 ms to 10 s (Documentation/accounting/psi.rst). */
	K_UINT("psi-window-ms", psi_window_ms, 500, 10000, "2000", false,
	       "PSI trigger window; without CAP_SYS_RESOURCE the kernel accepts only multiples of 2000."),
	K_UINT("psi-stall-ms", psi_stall_ms, 1, 10000, "100", false,
	       "Memory stall within one PSI window that wakes the daemon; at most psi-window-ms."),
	K_UINT("revoke-deadline-ms", revoke_deadline_ms, 1, HOUR_MS, "5000", true,
	       "Time a client has to give back a revoked lease before revoke-enforce applies."),
	/*
	 * A non-admin's own revoke with a 1 ms deadline would make every lease of
	 * a uid overdue in one round: the floor gives the holder's processes time
	 * to let go before any enforcement runs.
	 */
	K_UINT("revoke-min-deadline-ms", revoke_min_deadline_ms, 1, HOUR_MS, "1000", true,
	       "Shortest deadline a non-admin may give when revoking its own leases; a shorter one (or 0) is raised to "
	       "it. Admin revokes and pressure reclaim are not bound by it."),
	/*
	 * Enforcement is sliced: a round's /proc scan and its signals run in
	 * slices of this much time, one per loop turn, so other clients' requests
	 * are served in between (the goal: no loop turn over 20 ms).
	 */
	K_UINT("enforce-slice-us", enforce_slice_us, 100, 1000000, "2000", true,
	       "Most time one loop turn spends on revoke enforcement (marking leases overdue, the /proc scan for "
	       "processes still mapping them, signals); the rest waits for the next turn, so other clients are "
	       "answered in between. One process's /proc entry is read whole, so a turn can pass it by that much. "
	       "The orphan rescans after a restart take the same slices, and stop inside a process too."),
	K_ENUM("revoke-enforce", revoke_enforce, enforce_choices, "sigterm", true,
	       "What happens to a client that misses a revoke deadline: none, disconnect, sigterm or sigkill. "
	       "sigterm by default: the job gets to clean up and exit; escalating to sigkill is the admin's choice. "
	       "A signal reaches the connection's process and every other process of the lease's uid that still "
	       "maps or holds its memory (found in /proc, which needs root or CAP_SYS_PTRACE). A revoke the "
	       "holder started itself signals only processes of the holder's own uid: attachers of other uids are "
	       "detached instead; pressure and admin revokes reach every mapper."),

	K_UINT("redeclare-grace-ms", redeclare_grace_ms, 0, HOUR_MS, "10000", false,
	       "After a restart, how long clients have to re-declare the leases they still hold."),
	K_STRING(
		"restart-state", restart_state, "", false,
		"File a clean stop writes naming every lease's memfds and holders, so that the next daemon counts what "
		"live processes still map (an absolute path; empty: $RUNTIME_DIRECTORY/restart-state under systemd, "
		"else the socket path with .state appended)."),
	/* Each check is one pass over /proc (about 30 ms per 1000 processes on the 2-CPU development VM). */
	K_UINT("orphan-rescan-ms", orphan_rescan_ms, 100, HOUR_MS, "2000", true,
	       "After a restart, how often memory an earlier daemon lent is checked in /proc; it stops being counted "
	       "at the first check that finds no live process mapping it. While nothing is let go the checks back "
	       "off, doubling up to 60 times this; a named holder's exit brings the next one forward."),
};

#define N_KEYS (sizeof(config_key_table) / sizeof(config_key_table[0]))
const size_t config_key_count = N_KEYS;
_Static_assert(N_KEYS <= CONFIG_MAX_KEYS, "raise CONFIG_MAX_KEYS");

const struct config_key *config_keys(size_t *n)
{
	if (n)
		*n = N_KEYS;
	return config_key_table;
}

const struct config_key *config_key_find(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < N_KEYS; i++)
		if (strcmp(config_key_table[i].name, name) == 0)
			return &config_key_table[i];
	return NULL;
}

/* Optimal string alignment distance: a swap of two letters ("bugdet") counts as one edit. */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	size_t d[64][64];

	if (la >= 64 || lb >= 64)
		return SIZE_MAX;
	for (size_t i = 0; i <= la; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= la; i++)
		for (size_t j = 1; j <= lb; j++) {
			size_t cost = a[i - 1] != b[j - 1];
			size_t v = d[i - 1][j] + 1;

			if (d[i][j - 1] + 1 < v)
				v = d[i][j - 1] + 1;
			if (d[i - 1][j - 1] + cost < v)
				v = d[i - 1][j - 1] + cost;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
				v = d[i - 2][j - 2] + 1;
			d[i][j] = v;
		}
	return d[la][lb];
}

/* The key closest to name, when it is close enough to be a typo; else NULL. */
static const char *suggest_key(const char *name)
{
	size_t best = SIZE_MAX, limit;
	const char *hit = NULL;

	for (size_t i = 0; i < N_KEYS; i++) {
		size_t dist = edit_distance(name, config_key_table[i].name);

		if (dist < best) {
			best = dist;
			hit = config_key_table[i].name;
		}
	}
	/* Two edits, or a third of the word for long keys, is a typo; more is a different word. */
	limit = strlen(name) / 3 > 2 ? strlen(name) / 3 : 2;
	return best <= limit ? hit : NULL;
}

const char *config_suggest_key(const char *name)
{
	return name ? suggest_key(name) : NULL;
}

const char *config_enforce_name(enum config_enforce e)
{
	if ((unsigned)e >= sizeof(enforce_choices) / sizeof(enforce_choices[0]) - 1)
		return "unknown";
	return enforce_choices[e];
}
