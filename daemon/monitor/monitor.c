/* SPDX-License-Identifier: MIT */
/* The pressure monitor: samples its sources from the loop, feeds the policy, reports transitions; the public API. */
#define _GNU_SOURCE
#include "monitor-int.h"

#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "pressure.h"
#include "util.h"

/*
 * Under pressure, or after a PSI trigger, sample this often: the target is
 * <= 100 ms from a crossing to REVOKE; earlyoom polls every 100-1000 ms and
 * systemd-oomd checks swap every 150 ms.
 */
#define FAST_POLL_MS 100
/* Without a configured interval (a zeroed config); config-keys.c's poll-interval-ms default says why 100. */
#define DEFAULT_POLL_MS 100

/* Swap-out rates are taken over at least this long, so a 100 ms poll does not turn a burst into a rate. */
#define RATE_WINDOW_MS 1000
#define VMSTAT_REL "proc/vmstat"

/* Sources whose failure is reported once, not on every poll. */
enum source {
	SRC_MEMINFO = 1u << 0,
	SRC_VMSTAT = 1u << 1,
	SRC_PSI = 1u << 2,
	SRC_CGROUP = 1u << 3,
	SRC_CGROUP_PSI = 1u << 4,
};

/* --- warnings once per outage --- */

static void source_failed(struct monitor *m, enum source src, const char *rel, int err, const char *consequence)
{
	if (m->warned & src)
		return;
	m->warned |= src;
	log_warnx("pressure monitor: cannot use %s/%s: %s; %s", m->proc_root, rel,
		  err == -EBADMSG ? "unexpected contents" : strerror(-err), consequence);
}

static void source_ok(struct monitor *m, enum source src, const char *rel)
{
	if (!(m->warned & src))
		return;
	m->warned &= ~(unsigned)src;
	log_info("pressure monitor: %s/%s is readable again", m->proc_root, rel);
}

/* --- sampling and transitions --- */

static void record(struct monitor *m, uint64_t when_ms, const char *text)
{
	struct monitor_event *e = &m->ring[m->ring_next];

	e->when_ms = when_ms;
	snprintf(e->text, sizeof(e->text), "%s", text);
	m->ring_next = (m->ring_next + 1) % MONITOR_EVENTS_MAX;
	if (m->ring_count < MONITOR_EVENTS_MAX)
		m->ring_count++;
}

static void transition(struct monitor *m, enum broker_state from, enum broker_state to, const char *why,
		       uint64_t when_ms)
{
	const char *f = pressure_state_name(from), *t = pressure_state_name(to);
	char text[sizeof(m->ring[0].text)];

	/* The ring's text is short by design; the log line below carries the whole why. */
	if (snprintf(text, sizeof(text), "%s -> %s: %.*s", f, t, (int)(sizeof(text) - 24), why) < 0)
		text[0] = '\0';
	record(m, when_ms, text);
	/*
	 * One line per transition, as a structured event (MESSAGE_ID, warning
	 * going up, info going down). A log_warnx beside it would print every
	 * transition twice; the event's limiter (20 per 5 s) is far above what
	 * hysteresis lets through, and the ring keeps every one for pinctl.
	 */
	log_event(EV_PRESSURE_TRANSITION, to > from ? LOG_WARNING : LOG_INFO, 0, (uid_t)-1, 0,
		  "memory pressure %s -> %s: %s", f, t, why);
	if (m->fn)
		m->fn(m->ud, from, to, why);
}

/* Poll fast while above normal or shortly after a trigger; otherwise at poll-interval-ms. */
static void timer_retune(struct monitor *m, uint64_t now)
{
	uint32_t want = m->poll_interval_ms ? m->poll_interval_ms : DEFAULT_POLL_MS;

	if ((pressure_state(m->policy) > BROKER_NORMAL || now < m->fast_until_ms) && want > FAST_POLL_MS)
		want = FAST_POLL_MS;
	if (want == m->timer_ms && ev_is_active(&m->timer))
		return;
	m->timer_ms = want;
	m->timer.repeat = want / 1000.0;
	ev_timer_again(m->loop, &m->timer);
}

/* pswpin/pswpout rates against the newest reference at least RATE_WINDOW_MS old. */
static void sample_vmstat(struct monitor *m, uint64_t now, struct pressure_sample *s, char *buf)
{
	const struct vm_point *base = NULL;
	struct vmstat v;
	size_t len;
	int r;

	/*
	 * No swap, no swap I/O: skip vmstat, the costliest file of a poll
	 * (4 KiB of per-CPU sums: 30 of the 50 us of preads, measured hot on
	 * the development VM). A swapon shows in the next meminfo.
	 */
	if (s->mem.swap_total_bytes == 0) {
		s->have_swapout = true;
		m->vm_old.set = m->vm_new.set = false;
		return;
	}
	r = mon_src_read(m->root_fd, &m->vmstat_f, VMSTAT_REL, buf, READ_BUF_BYTES, &len);
	if (r == 0)
		r = pressure_parse_vmstat(buf, len, &v);
	if (r < 0) {
		source_failed(m, SRC_VMSTAT, VMSTAT_REL, r, "swap-out rate not watched");
		m->vm_old.set = m->vm_new.set = false;
		return;
	}
	source_ok(m, SRC_VMSTAT, VMSTAT_REL);
	m->vm_last = (struct vm_point){ true, now, v };
	if (m->vm_new.set && now - m->vm_new.ms >= RATE_WINDOW_MS)
		base = &m->vm_new;
	else if (m->vm_old.set)
		base = &m->vm_old;
	else if (m->vm_new.set)
		base = &m->vm_new;
	if (base && now > base->ms) {
		s->have_swapout = true;
		s->swapout_pages_s = pressure_rate_per_s(base->v.pswpout, v.pswpout, now - base->ms);
		s->swapin_pages_s = pressure_rate_per_s(base->v.pswpin, v.pswpin, now - base->ms);
	}
	if (!m->vm_new.set) {
		m->vm_new = (struct vm_point){ true, now, v };
	} else if (now - m->vm_new.ms >= RATE_WINDOW_MS) {
		m->vm_old = m->vm_new;
		m->vm_new = (struct vm_point){ true, now, v };
	}
}

static void psi_merge(struct psi_line *dst, const struct psi_line *src)
{
	if (!src->present)
		return;
	if (!dst->present) {
		*dst = *src;
		return;
	}
	dst->avg10 = fmax(dst->avg10, src->avg10);
	dst->avg60 = fmax(dst->avg60, src->avg60);
	dst->avg300 = fmax(dst->avg300, src->avg300);
}

static void sample_psi(struct monitor *m, struct pressure_sample *s, char *buf)
{
	char rel[REL_PATH_MAX + 32];
	struct psi p;
	size_t len;
	int r;

	r = mon_src_read(m->root_fd, &m->psi_f, PSI_REL, buf, READ_BUF_BYTES, &len);
	if (r == 0)
		r = pressure_parse_psi(buf, len, &p);
	if (r == 0) {
		source_ok(m, SRC_PSI, PSI_REL);
		s->have_psi = true;
		s->psi = p;
	} else if (r != -ENOENT) {
		source_failed(m, SRC_PSI, PSI_REL, r, "PSI not watched");
	}

	/*
	 * A v2 cgroup stalls on its own limit while the host is calm: take the
	 * worse of the two, since either way pinning more makes it worse.
	 */
	if (m->cg.loc.kind != CG_V2 || strcmp(m->cg.loc.dir, m->cg.loc.mount) == 0)
		return;
	snprintf(rel, sizeof(rel), "%s/memory.pressure", m->cg.loc.dir);
	r = mon_src_read(m->root_fd, &m->cg_psi_f, rel, buf, READ_BUF_BYTES, &len);
	if (r == -ENOENT)
		return;
	if (r == 0)
		r = pressure_parse_psi(buf, len, &p);
	if (r < 0) {
		source_failed(m, SRC_CGROUP_PSI, rel, r, "the cgroup's PSI not watched");
		return;
	}
	source_ok(m, SRC_CGROUP_PSI, rel);
	s->have_psi = true;
	psi_merge(&s->psi.some, &p.some);
	psi_merge(&s->psi.full, &p.full);
}

/* refresh_limits: read the cgroup limits now rather than when they are due. */
static void mon_sample(struct monitor *m, bool refresh_limits)
{
	struct pressure_sample s = { 0 };
	struct cg_reading cg;
	enum broker_state old = pressure_state(m->policy), next;
	char buf[READ_BUF_BYTES];
	char why[512];
	uint64_t now = now_ms();
	bool want_why;
	int r;

	r = mon_read_meminfo(m->root_fd, &m->meminfo_f, &s.mem, buf);
	if (r < 0) {
		/* Without meminfo nothing can be judged: keep the state, try again next poll. */
		source_failed(m, SRC_MEMINFO, MEMINFO_REL, r, "keeping the current pressure state");
		timer_retune(m, now);
		return;
	}
	source_ok(m, SRC_MEMINFO, MEMINFO_REL);
	sample_vmstat(m, now, &s, buf);
	sample_psi(m, &s, buf);
	if (m->cg.loc.kind != CG_NONE) {
		r = mon_cg_read(m->root_fd, &m->cg, now, refresh_limits, &cg, buf);
		if (r < 0) {
			source_failed(m, SRC_CGROUP, m->cg.loc.dir, r, "the cgroup limit is not watched");
		} else {
			source_ok(m, SRC_CGROUP, m->cg.loc.dir);
			s.have_cgroup_limit = cg.have_limit;
			s.cgroup_limit_bytes = cg.limit_bytes;
			s.cgroup_usage_bytes = cg.usage_bytes;
			s.cgroup_reclaimable_bytes = cg.reclaimable_bytes;
		}
	}

	/*
	 * The why costs about 30 us a poll on the development VM (vsnprintf of
	 * doubles, cold after 100 ms asleep), a third of an idle poll. From
	 * normal, evaluate moves only when the level is above normal, so a calm
	 * poll needs no why unless the debug line below prints it.
	 */
	why[0] = '\0';
	pressure_figures(&s, &m->figs);
	want_why = old != BROKER_NORMAL || log_level >= LOG_DEBUG ||
		   pressure_level(pressure_get_thresholds(m->policy), &m->figs) != BROKER_NORMAL;
	next = pressure_evaluate(m->policy, &s, now, want_why ? why : NULL, sizeof(why));
	m->sample = s;
	m->have_sample = true;
	if (next != old) {
		transition(m, old, next, why, now);
	} else {
		log_debug("pressure %s: %s", pressure_state_name(next), why);
	}
	timer_retune(m, now);
}

/* m's PSI trigger fired (monitor-psi.c, through m->on_trigger): the stall is building, sample now. */
static void trigger_fired(struct monitor *m)
{
	mon_sample(m, false);
}

static void timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	mon_sample(w->data, false);
}

/* --- construction and reconfiguration --- */

static void thresholds_from(const struct config *cfg, struct pressure_thresholds *t)
{
	*t = (struct pressure_thresholds){
		.tight_mem_available_pct = cfg->tight_mem_available_pct,
		.critical_mem_available_pct = cfg->critical_mem_available_pct,
		.tight_psi_some_avg10 = cfg->tight_psi_some_avg10,
		.critical_psi_full_avg10 = cfg->critical_psi_full_avg10,
		.tight_swapout_pages_s = cfg->tight_swapout_pages_s,
		.critical_swapout_pages_s = cfg->critical_swapout_pages_s,
		.tight_swap_free_pct = cfg->tight_swap_free_pct,
		.hysteresis_ms = cfg->hysteresis_ms,
	};
}

int monitor_new(struct ev_loop *loop, const struct config *cfg, monitor_state_fn fn, void *ud, struct monitor **ret)
{
	struct pressure_thresholds t;
	struct meminfo mi;
	struct monitor *m;
	char *buf = NULL;
	int r;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->loop = loop;
	m->fn = fn;
	m->ud = ud;
	m->on_trigger = trigger_fired;
	m->root_fd = m->epfd = m->psi_fd[0] = m->psi_fd[1] = -1;
	mon_src_init(&m->meminfo_f, true);
	mon_src_init(&m->vmstat_f, false);
	mon_src_init(&m->psi_f, true);
	mon_src_init(&m->cg_psi_f, true);
	m->proc_root = strdup(cfg->proc_root && *cfg->proc_root ? cfg->proc_root : "/");
	buf = malloc(READ_BUF_BYTES);
	if (!m->proc_root || !buf) {
		r = -ENOMEM;
		goto fail;
	}
	/* Display: "/" + "/proc/meminfo" would read "//proc/meminfo". */
	if (strcmp(m->proc_root, "/") == 0)
		m->proc_root[0] = '\0';
	m->root_fd = open(*m->proc_root ? m->proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (m->root_fd < 0) {
		r = -errno;
		log_warnx("pressure monitor: proc-root %s: %s", cfg->proc_root, strerror(-r));
		goto fail;
	}
	r = mon_read_meminfo(m->root_fd, &m->meminfo_f, &mi, buf);
	if (r < 0) {
		log_warnx("pressure monitor: cannot use %s/%s: %s", m->proc_root, MEMINFO_REL,
			  r == -EBADMSG ? "MemTotal or MemAvailable missing or malformed" : strerror(-r));
		goto fail;
	}

	thresholds_from(cfg, &t);
	r = pressure_new(&t, &m->policy);
	if (r < 0)
		goto fail;
	m->poll_interval_ms = cfg->poll_interval_ms ? cfg->poll_interval_ms : DEFAULT_POLL_MS;
	m->psi_window_ms = cfg->psi_window_ms;
	m->psi_stall_ms = cfg->psi_stall_ms;
	mon_cg_resolve(m->root_fd, &m->cg.loc, buf);
	mon_cg_levels_init(&m->cg);
	free(buf);
	buf = NULL;

	mon_triggers_arm(m);
	/*
	 * The first evaluation runs from the loop, right away, so fn hears of a
	 * host that is already tight or critical at start like any other change.
	 */
	ev_init(&m->timer, timer_cb);
	m->timer.data = m;
	m->timer_ms = m->poll_interval_ms;
	ev_timer_set(&m->timer, 0., m->poll_interval_ms / 1000.0);
	ev_timer_start(loop, &m->timer);
	*ret = m;
	return 0;
fail:
	free(buf);
	monitor_free(m);
	return r;
}

void monitor_free(struct monitor *m)
{
	if (!m)
		return;
	if (m->loop)
		ev_timer_stop(m->loop, &m->timer);
	mon_triggers_close(m);
	mon_src_close(&m->meminfo_f);
	mon_src_close(&m->vmstat_f);
	mon_src_close(&m->psi_f);
	mon_src_close(&m->cg_psi_f);
	mon_cg_close(&m->cg);
	if (m->root_fd >= 0)
		close(m->root_fd);
	pressure_free(m->policy);
	free(m->proc_root);
	free(m);
}

int monitor_reconfigure(struct monitor *m, const struct config *cfg)
{
	struct pressure_thresholds t;
	bool rearm;

	thresholds_from(cfg, &t);
	pressure_set_thresholds(m->policy, &t);
	rearm = cfg->psi_window_ms != m->psi_window_ms || cfg->psi_stall_ms != m->psi_stall_ms;
	m->poll_interval_ms = cfg->poll_interval_ms ? cfg->poll_interval_ms : DEFAULT_POLL_MS;
	m->psi_window_ms = cfg->psi_window_ms;
	m->psi_stall_ms = cfg->psi_stall_ms;
	if (rearm)
		mon_triggers_arm(m);
	/* Judge the new thresholds now rather than at the next tick; a reload is also when limits get looked at. */
	mon_sample(m, true);
	return 0;
}

void monitor_sample_now(struct monitor *m)
{
	mon_sample(m, true);
}

enum broker_state monitor_state(const struct monitor *m)
{
	return pressure_state(m->policy);
}

double monitor_mem_available_pct(const struct monitor *m)
{
	return m->have_sample ? m->figs.mem_available_pct : NAN;
}

uint64_t monitor_huge_pages_free_bytes(const struct monitor *m)
{
	return m->have_sample ? m->sample.mem.hugepages_free_bytes : 0;
}

const char *monitor_state_name(enum broker_state s)
{
	return pressure_state_name(s);
}

const char *monitor_mode(const struct monitor *m)
{
	return m->mode;
}

size_t monitor_signals(const struct monitor *m, struct monitor_signal *out, size_t max)
{
	const struct pressure_thresholds *t = pressure_get_thresholds(m->policy);
	const struct pressure_figures *f = &m->figs;
	const struct pressure_sample *s = &m->sample;
	bool ok = m->have_sample;
	const struct monitor_signal all[] = {
		{ "mem_available_pct", f->mem_available_pct, t->tight_mem_available_pct, t->critical_mem_available_pct,
		  "%", ok },
		{ "mem_available_bytes", (double)f->mem_available_bytes, NAN, NAN, "bytes", ok },
		{ "swap_free_pct", f->swap_free_pct, t->tight_swap_free_pct, NAN, "%",
		  ok && s->mem.swap_total_bytes > 0 },
		{ "swapout_pages_s", f->swapout_pages_s, t->tight_swapout_pages_s, t->critical_swapout_pages_s,
		  "pages/s", ok && s->have_swapout },
		{ "swapin_pages_s", f->swapin_pages_s, NAN, NAN, "pages/s", ok && s->have_swapout },
		{ "psi_some_avg10", f->psi_some_avg10, t->tight_psi_some_avg10, NAN, "%", ok && s->have_psi },
		{ "psi_full_avg10", f->psi_full_avg10, NAN, t->critical_psi_full_avg10, "%",
		  ok && s->have_psi && s->psi.full.present },
		{ "cgroup_usage_pct", f->cgroup_usage_pct, NAN, NAN, "%", ok && s->have_cgroup_limit },
	};
	size_t n = sizeof(all) / sizeof(all[0]);

	_Static_assert(sizeof(all) / sizeof(all[0]) == MONITOR_SIGNALS_MAX, "MONITOR_SIGNALS_MAX counts the signals");

	for (size_t i = 0; i < n && i < max; i++)
		out[i] = all[i];
	return n;
}

bool monitor_swap_pages(const struct monitor *m, uint64_t *in_pages, uint64_t *out_pages)
{
	if (!m->vm_last.set)
		return false;
	*in_pages = m->vm_last.v.pswpin;
	*out_pages = m->vm_last.v.pswpout;
	return true;
}

size_t monitor_transitions(const struct monitor *m, struct monitor_event *out, size_t max)
{
	size_t n = m->ring_count < max ? m->ring_count : max;

	for (size_t i = 0; i < n; i++)
		out[i] = m->ring[(m->ring_next + MONITOR_EVENTS_MAX - 1 - i) % MONITOR_EVENTS_MAX];
	return n;
}

int monitor_read_host(const char *proc_root, struct monitor_host *ret)
{
	struct meminfo m;
	struct src_file meminfo_f;
	struct cg_src *cg = NULL;
	struct cg_reading reading;
	char *buf;
	int root_fd = -1, r;

	memset(ret, 0, sizeof(*ret));
	mon_src_init(&meminfo_f, true);
	buf = malloc(READ_BUF_BYTES);
	cg = calloc(1, sizeof(*cg));
	if (!buf || !cg) {
		r = -ENOMEM;
		goto out;
	}
	root_fd = open(proc_root && *proc_root ? proc_root : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0) {
		r = -errno;
		goto out;
	}
	r = mon_read_meminfo(root_fd, &meminfo_f, &m, buf);
	mon_src_close(&meminfo_f);
	if (r < 0)
		goto out;
	ret->mem_total_bytes = m.mem_total_bytes;
	ret->mem_available_bytes = m.mem_available_bytes;
	mon_cg_resolve(root_fd, &cg->loc, buf);
	mon_cg_levels_init(cg);
	if (mon_cg_read(root_fd, cg, now_ms(), true, &reading, buf) == 0 && reading.have_limit) {
		ret->cgroup_limit_bytes = reading.limit_bytes;
		ret->cgroup_usage_bytes = reading.usage_bytes;
	}
	mon_cg_close(cg);
	r = 0;
out:
	if (root_fd >= 0)
		close(root_fd);
	free(cg);
	free(buf);
	return r;
}
