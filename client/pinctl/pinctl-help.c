/* SPDX-License-Identifier: MIT */
/* Every help text pinctl prints: the usage, and each command's --help (scripts/gen-docs.sh builds docs from them). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "pinbroker.h"
#include "pinctl-doctor.h"
#include "pinctl-help.h"
#include "pinctl.h"
#include "wire.h"

void pinctl_usage(FILE *f)
{
	fprintf(f,
		"Usage: pinctl [--socket PATH] [--wait[=SECONDS]] COMMAND [ARGS]\n"
		"\n"
		"Commands:\n"
		"  status [TABLE OPTIONS]            budget, pool, pressure signals and clients\n"
		"  leases [TABLE OPTIONS]            every lease on the host (fetched page by page)\n"
		"  acquire SIZE [--hold SECONDS] [--label L] [--priority normal|critical|best-effort]\n"
		"          [--wait MS]               borrow SIZE (e.g. 64M, 1G), touch it, hold, release\n"
		"  revoke LEASE | --uid USER | --all | --reservation ID [--deadline MS] [--orphans]\n"
		"                                    ask clients to give leases back (admin)\n"
		"  top [--interval SECONDS] [--once] a live view of the budget, clients and leases (also: watch)\n"
		"  get KEY [TABLE OPTIONS]           one running setting and where it came from\n"
		"  config [TABLE OPTIONS]            every running setting, each with its source (default,\n"
		"                                    file:line, environment, command line, set)\n"
		"  set KEY VALUE                     change a reloadable daemon setting (admin)\n"
		"  metrics [TABLE OPTIONS]           the daemon's Prometheus metrics (text format)\n"
		"  run [--fallback cuda|error|pageable] [--label L] [--no-torch] [--] CMD [ARGS]\n"
		"                                    run an unmodified program with its pinned memory\n"
		"                                    under the budget (LD_PRELOAD=libpinbroker-preload.so)\n"
		"  doctor [TABLE OPTIONS]            check this host's set-up, each finding with its fix\n"
		"                                    (exit 0 nothing to do, 1 a warning, 3 no daemon,\n"
		"                                    4 a failure)\n"
		"  quota set CGROUP SIZE | clear CGROUP [--revoke] | list [TABLE OPTIONS]\n"
		"                                    per-job quotas over cgroup paths (admin to change)\n"
		"  jobs [TABLE OPTIONS]              pinned bytes per job (cgroup), with quotas\n"
		"  headroom [--no-revoke] [TABLE OPTIONS]\n"
		"                                    how much this client may still acquire now, and why\n"
		"  reservations [TABLE OPTIONS]      groups' all-or-nothing reservations: shares taken, bytes held\n"
		"  help [COMMAND | --commands]       this text, or COMMAND's (also: pinctl COMMAND --help)\n"
		"\n"
		"Options:\n"
		"  --socket PATH   daemon socket (default $%s, else %s); also after the command\n"
		"  --wait[=SECONDS]  before the command: wait up to SECONDS (default %d) for a daemon that is\n"
		"                  not there yet (no socket, nobody listening), as right after pinbrokerd ... &\n"
		"  --version       print the version\n"
		"\n"
		"TABLE OPTIONS, alike on every command that prints a table (status, leases, jobs, reservations,\n"
		"quota list, doctor, config, get, metrics, headroom): --json | -o FIELD,... | --format text|csv|json,\n"
		"and --no-headers.\n"
		"With --json (or --format json) an error is also one JSON object on stdout,\n"
		"{\"error\": {\"code\", \"message\", \"exit_status\"}}, the exit status the same.\n"
		"\n"
		"Exit status: 0 success, 1 error, 2 usage, 3 no daemon answers (nothing listens on the\n"
		"socket, or it did not answer in time); run exits with its program's status (126/127 when\n"
		"it cannot be run). A usage error names its command and points to that command's --help.\n",
		PB_SOCKET_ENV, PB_DEFAULT_SOCKET, PINCTL_WAIT_DEFAULT_S);
}

const char quota_help[] =
	"Usage: pinctl quota set CGROUP SIZE [--revoke [--deadline MS]]\n"
	"       pinctl quota clear CGROUP [--revoke] [--deadline MS]\n"
	"       pinctl quota list [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
	"\n"
	"Per-job quotas. Every lease is charged to its client's cgroup (the v1 memory controller's path\n"
	"where the host has one, else the unified hierarchy's, as /proc/PID/cgroup shows). A quota rule\n"
	"names a cgroup path, and each component may be a glob: the jobs it makes are the cgroups whose\n"
	"first components match, each with SIZE of its own.\n"
	"  pinctl quota set /system.slice/slurmstepd.scope/job_42 8G    one Slurm job, all its steps\n"
	"  pinctl quota set '/kubepods.slice/kubepods-burstable.slice/*' 16G   each burstable pod 16G\n"
	"Setting and clearing need admin rights. A rule set here outlives reloads, restarts, crashes and\n"
	"upgrades (the daemon keeps it in /run/pinbrokerd/quota-rules, not past a reboot); it is released\n"
	"when its cgroup, once seen, is gone (a glob rule stays until cleared). Rules from the job-quota\n"
	"config key come back on reload. Lowering a quota revokes nothing: use --revoke.\n"
	"\n"
	"  --revoke        also revoke the leases of every job CGROUP matches\n"
	"  --deadline MS   time their holders have (default: the daemon's revoke-deadline-ms)\n"
	"  --json          list as {schema_version, rules[], jobs[]}\n"
	"  -o, --output F  the rules' rows of these fields, comma-separated, in aligned columns under a\n"
	"                  header (CSV with --format csv): pattern, bytes, source, seen\n"
	"  --format FMT    text (the default: the rules and the jobs, as tables), csv (a header of field\n"
	"                  names, then a row per rule) or json (as --json)\n"
	"  --no-headers    no header line; alone, the rules' rows of every field without one\n";

const char jobs_help[] =
	"Usage: pinctl jobs [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
	"\n"
	"Pinned bytes per job, largest first: each cgroup with leases, or the part of its path a\n"
	"quota rule names, with its quota. Admins (or status-visibility = all) see every job,\n"
	"others their own.\n"
	"\n"
	"  --json          {schema_version, jobs[]}\n"
	"  -o, --output F  a row per job of these fields, comma-separated, in aligned columns under a\n"
	"                  header (CSV with --format csv): job, bytes, leases, quota_bytes, rule, source\n"
	"                  (the last three null, '-' in columns, for a job without a quota)\n"
	"  --format FMT    text (the default), csv (a header of field names, then a row per job of every\n"
	"                  field, or of -o's) or json (as --json)\n"
	"  --no-headers    no header line\n";

const char reservations_help[] =
	"Usage: pinctl reservations [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
	"\n"
	"All-or-nothing reservations of groups of ranks (pb_reserve, Client.reserve): N shares of B\n"
	"bytes charged at once; the bytes of shares not taken yet count as leased. Admins (or\n"
	"status-visibility = all) see every one, others their own uid's. pinctl revoke --reservation ID\n"
	"ends one.\n"
	"\n"
	"  --json          {schema_version, reserved_bytes, reservations[]}\n"
	"  -o, --output F  a row per reservation of these fields, comma-separated, in aligned columns\n"
	"                  under a header (CSV with --format csv): id, uid, job, name, shares,\n"
	"                  share_bytes, taken, bytes_reserved, state (open, taken), members, age_ms\n"
	"  --format FMT    text (the default), csv (a header of field names, then a row per reservation)\n"
	"                  or json (as --json)\n"
	"  --no-headers    no header line\n";

const char doctor_help[] =
	"Usage: pinctl doctor [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
	"\n"
	"Check this host's set-up for pinbrokerd and say how to fix what is wrong: the daemon's and your\n"
	"memlock limits, huge pages and THP, the CUDA driver, the socket and groups, the cgroup, PSI,\n"
	"the service, and the budget against MemTotal and the GPUs' memory.\n"
	"\n"
	"  --json          one JSON object {schema_version, checks, warnings, failures, exit_status},\n"
	"                  each of checks {check, status, message, fix}; status is ok, warn, fail or skip\n"
	"  -o, --output F  a row per check of these fields (check, status, message, fix), in aligned\n"
	"                  columns under a header (CSV with --format csv)\n"
	"  --format FMT    text (the default), csv (a header, then a row per check) or json (as --json)\n"
	"  --no-headers    no header line; alone, the rows of every field without one\n"
	"\n"
	"A socket that every local user may connect to (mode o+w under folders that let others through)\n"
	"is a warning: pinbrokerd binds it 0660 group pinbroker, 0666 only where that group is missing.\n"
	"\n"
	"Exit status: 0 nothing to do (every check ok or skipped), 1 a warning (advice worth taking),\n"
	"2 usage, 3 no daemon answers and nothing else failed, 4 a failure (a real problem).\n" DOCTOR_ROOT_ENV
	"=DIR reads the host's /proc and /sys files under DIR (for tests).\n";

/* One command's --help (pinctl CMD --help, pinctl help CMD): its usage, what it does, its options. */
static const struct command_help {
	const char *name;
	const char *text;
} helps[] = {
	{ "status", "Usage: pinctl status [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
		    "\n"
		    "The budget, leased, pool and free memory, the page kind, the pressure state and its signals,\n"
		    "recent transitions and revocations, and one row per client connection.\n"
		    "\n"
		    "  --json          the stable JSON schema (schema_version 1), every lease row included,\n"
		    "                  each client's cgroup and the jobs (jobs[])\n"
		    "  -o, --output F  one row of these fields, comma-separated, in aligned columns under a\n"
		    "                  header (CSV with --format csv); a field unknown is a usage error\n"
		    "  --format FMT    text (the default), csv (a header of field names, then one row of every\n"
		    "                  field, or of -o's) or json (as --json)\n"
		    "  --no-headers    no header line; alone, the row of every field without one\n"
		    "\n"
		    "The fields are the scalar keys of --json, with its values (bytes, ms, true/false): version,\n"
		    "budget_bytes, uid_quota_bytes, leased_bytes, pool_bytes, pool_idle_bytes, free_bytes,\n"
		    "page_size_bytes, chunk_size_bytes, chunk_max_bytes, chunk_capacity, pool_warming, hugetlb,\n"
		    "page_kind, "
		    "thp_bytes, thp_failures, hugetlb_bytes, huge_pages_free_bytes, overdue_bytes,\n"
		    "cached_idle_bytes, registered_bytes, no_revoke_bytes, unbrokered_bytes,\n"
		    "unbrokered_reported_bytes, unbrokered_cap_bytes, orphaned_bytes, prewarm_bytes,\n"
		    "waiting_acquires, pressure_state, monitor_mode, uptime_ms, cgroup_namespace, cgroup_ns_root,\n"
		    "job_unknown_clients, job_unknown_total, staging_rings, staging_ring_bytes, staged_h2d_bytes,\n"
		    "staged_d2h_bytes.\n"
		    "Example: pinctl status -o free_bytes,pool_idle_bytes --no-headers\n" },
	{ "leases", "Usage: pinctl leases [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
		    "\n"
		    "Every lease on the host you may see (all of them as an admin), fetched page by page: its NUMA\n"
		    "node (NODE, '!' when misplaced, '-' when not placed) and the job it is charged to (JOB).\n"
		    "\n"
		    "  --json          {schema_version, leases[]}\n"
		    "  -o, --output F  one line per lease of these fields, comma-separated, in aligned columns\n"
		    "                  under a header (CSV with --format csv); a field unknown is a usage error\n"
		    "  --format FMT    text (the default), csv (a header of field names, then a row per lease of\n"
		    "                  every field, or of -o's) or json (as --json)\n"
		    "  --no-headers    no header line\n"
		    "\n"
		    "The fields are the keys of --json's lease rows, with its values (bytes, ms, true/false;\n"
		    "null is '-' in columns and empty in CSV; pid lists space-separated): id, pid, uid,\n"
		    "user, bytes, label, age_ms, priority, state, idle_ms, deadline_left_ms, shared,\n"
		    "holder_detached, registration, no_revoke, numa_node, misplaced, job, attachers,\n"
		    "attacher_pids, charged_bytes, registrants, registrant_pids, staging_ring. Labels and\n"
		    "jobs are C-escaped, so no value spans lines. A staging ring's row is followed by a line\n"
		    "naming it (STAGING RING).\n"
		    "Example: pinctl leases -o id,bytes,label --format csv --no-headers\n" },
	{ "acquire", "Usage: pinctl acquire SIZE [--hold SECONDS] [--label L] [--priority P] [--wait MS]\n"
		     "\n"
		     "Borrow SIZE (4096, 64M, 1G) from the daemon, map it, touch every page, report the timings,\n"
		     "hold it, then release it. A revoke, SIGINT or SIGTERM releases it early. When the daemon must\n"
		     "first grow its pool for the lease (SIZE over its idle memory), or --wait may wait for memory,\n"
		     "pinctl says so on stderr before it asks.\n"
		     "\n"
		     "  --hold SECONDS  keep the lease this long (fractions allowed; default 0)\n"
		     "  --label L       the label status and leases show\n"
		     "  --priority P    normal, critical (revoked last) or best-effort (revoked first)\n"
		     "  --wait MS       wait up to MS for memory instead of being refused at once\n" },
	{ "revoke", "Usage: pinctl revoke LEASE | --uid USER | --all | --reservation ID [--deadline MS]\n"
		    "       pinctl revoke --orphans --uid USER | --all\n"
		    "\n"
		    "Ask the holders to give leases back (admin): one lease by id, every lease of a uid, or all.\n"
		    "\n"
		    "  --uid USER      every lease of USER, a user name or a uid\n"
		    "  --all           every lease on the host\n"
		    "  --reservation ID  end reservation ID (its untaken bytes go back) and revoke the leases\n"
		    "                  taken from it; its own uid may too (ids: pinctl reservations)\n"
		    "  --deadline MS   time the holders have before revoke-enforce applies (default: the daemon's\n"
		    "                  revoke-deadline-ms)\n"
		    "  --orphans       instead, stop counting orphaned memory (what the daemon before a restart\n"
		    "                  lent, or a memfd found by its name) of USER, or all of it: nothing is\n"
		    "                  signalled; use it for memory the log says is not the daemon's\n" },
	{ "top", "Usage: pinctl top [--interval SECONDS] [--once]   (also: pinctl watch)\n"
		 "\n"
		 "A live view, refreshed in place: the budget, leased, pool and pressure, then the clients and the\n"
		 "leases holding the most bytes, as many as the terminal has room for. q or Ctrl-C quits.\n"
		 "Colour only on a terminal, and not with NO_COLOR set (https://no-color.org). When stdout is not\n"
		 "a terminal it prints one frame ($LINES x $COLUMNS, else 24x80) and exits.\n"
		 "\n"
		 "  --interval S    seconds between refreshes, 0.1 to 3600 (default 1; also -n S)\n"
		 "  --once          print one frame and exit\n" },
	{ "watch", "Usage: pinctl watch [--interval SECONDS] [--once]\n"
		   "\n"
		   "Another name for pinctl top.\n" },
	{ "get", "Usage: pinctl get KEY [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
		 "\n"
		 "The running value of one daemon setting, as the config file spells it (8G, 25%, 30000), and\n"
		 "where it came from: default, file PATH:LINE, environment, command line, or set (pinctl set).\n"
		 "Any user may read the config. An unknown key is an error naming the closest key.\n"
		 "\n"
		 "  --json          {schema_version, config: {key, value, source, file, line, reloadable}}\n"
		 "  -o, --output F  the row of these fields (key, value, source, file, line, reloadable), in\n"
		 "                  aligned columns under a header (CSV with --format csv); file and line are\n"
		 "                  null ('-') for a value not from a file\n"
		 "  --format FMT    text (the default), csv or json (as --json)\n"
		 "  --no-headers    no header line; alone, the row of every field without one\n"
		 "Example: pinctl get budget -o value --no-headers\n" },
	{ "config", "Usage: pinctl config [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
		    "\n"
		    "Every running daemon setting as 'key = value  # source' lines (config-file syntax), the source\n"
		    "being default, file PATH:LINE, environment, command line, or set (pinctl set). A SIGHUP reload\n"
		    "re-reads the file but keeps the set values until the daemon restarts.\n"
		    "\n"
		    "  --json          {schema_version, config: [{key, value, source, file, line, reloadable}]}\n"
		    "  -o, --output F  a row per key of these fields (key, value, source, file, line,\n"
		    "                  reloadable), in aligned columns under a header (CSV with --format csv)\n"
		    "  --format FMT    text (the default), csv or json (as --json)\n"
		    "  --no-headers    no header line; alone, the rows of every field without one\n" },
	{ "set", "Usage: pinctl set KEY VALUE\n"
		 "\n"
		 "Change a reloadable daemon setting at run time (admin), e.g. pinctl set budget 8G. The value\n"
		 "wins over the file and the command line, also on reload, until the daemon restarts;\n"
		 "pinctl get KEY then shows its source as set. The keys: pinctl config, pinbrokerd --config-doc.\n" },
	{ "run", "Usage: pinctl run [--fallback cuda|error|pageable] [--label L] [--no-torch] [--] CMD [ARGS]\n"
		 "\n"
		 "Run an unmodified program with its pinned memory (cudaHostAlloc, cudaMallocHost,\n"
		 "cudaHostRegister and the driver API's) taken from the budget: LD_PRELOAD=libpinbroker-preload.so.\n"
		 "Options end at CMD; its own options are its own.\n"
		 "\n"
		 "  --fallback P    when the daemon refuses: cuda (the driver's own pinned memory, the default),\n"
		 "                  error (the call fails) or pageable (ordinary memory)\n"
		 "  --label L       the label its leases carry\n"
		 "  --no-torch      do not install pinbroker's torch host allocator in Python programs\n"
		 "\n"
		 "Exit status: the program's, or 126/127 when it cannot be run.\n" },
	{ "metrics", "Usage: pinctl metrics [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
		     "\n"
		     "The daemon's Prometheus metrics in the text format: what metrics-path holds. The per-uid\n"
		     "and per-job series as the daemon's metrics-detail says (all, the default: for everyone).\n"
		     "\n"
		     "  --json          {schema_version, metrics: [{name, type, labels: {NAME: VALUE}, value}]}, a\n"
		     "                  sample each; values are strings, as Prometheus' API writes them (NaN, +Inf)\n"
		     "  -o, --output F  a row per sample of these fields (name, type, labels, value), in aligned\n"
		     "                  columns under a header (CSV with --format csv); labels as the text has them\n"
		     "  --format FMT    text (the default: the exposition format), csv or json (as --json)\n"
		     "  --no-headers    no header line; alone, the samples' rows of every field without one\n"
		     "Example: pinctl metrics -o name,value --no-headers\n" },
	{ "doctor", doctor_help },
	{ "quota", quota_help },
	{ "jobs", jobs_help },
	{ "headroom",
	  "Usage: pinctl headroom [--no-revoke] [--json | -o FIELD,... | --format text|csv|json] [--no-headers]\n"
	  "\n"
	  "How much this client (its uid, its job, this connection) may still acquire now, from one\n"
	  "state of the daemon: every bound an acquire meets (the budget, the uid and job quotas, the\n"
	  "never-revoked cap, the pressure state, the lease and fd caps) with what is used and left,\n"
	  "and the one that binds (marked *). An acquire of the available bytes is granted now; one of\n"
	  "a page more is refused, naming that bound. Size a process's pinned pool from it.\n"
	  "\n"
	  "  --no-revoke     for a lease that is never revoked (PB_ACQUIRE_NO_REVOKE, the interposer's):\n"
	  "                  max-no-revoke-per-uid bounds it too, and any pressure refuses it\n"
	  "  --json          {schema_version, available_bytes, page_bytes, state, binding, bounds[]},\n"
	  "                  each of bounds {bound, limit, used, left_bytes, binding, reason}\n"
	  "  -o, --output F  a row per bound of these fields, comma-separated, in aligned columns under a\n"
	  "                  header (CSV with --format csv): bound, limit, used, left_bytes, binding,\n"
	  "                  reason, available_bytes (limit and used count leases or fds for uid_leases,\n"
	  "                  uid_chunks, capacity and connection_leases; left_bytes null, '-' in columns,\n"
	  "                  where such a cap bounds no bytes)\n"
	  "  --format FMT    text (the default), csv (a header of field names, then a row per bound) or\n"
	  "                  json (as --json)\n"
	  "  --no-headers    no header lines\n" },
	{ "reservations", reservations_help },
	{ "help", "Usage: pinctl help [COMMAND | --commands]\n"
		  "\n"
		  "pinctl's usage, or one command's help (as pinctl COMMAND --help).\n"
		  "\n"
		  "  --commands      every command, a line each, for scripts and completions: its name, what it\n"
		  "                  takes (json: --json, and its errors then JSON on stdout; table: -o,\n"
		  "                  --format and --no-headers; - for neither), and the arguments of its table\n"
		  "                  form (KEY: a config key), tab-separated\n" },
};

int pinctl_help_text(const char *name, FILE *f)
{
	for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
		if (strcmp(helps[i].name, name) != 0)
			continue;
		fputs(helps[i].text, f);
		fprintf(f,
			"\n"
			"Options every command takes (before or after its name):\n"
			"  --socket PATH   daemon socket (default $%s, else %s)\n"
			"  --help          this text\n",
			PB_SOCKET_ENV, PB_DEFAULT_SOCKET);
		return 0;
	}
	return -ENOENT;
}
