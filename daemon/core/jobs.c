/* SPDX-License-Identifier: MIT */
/* Per-job quotas: cgroup rules, the jobs they make, and what each is charged (jobs.h). */
#define _GNU_SOURCE
#include "jobs.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/*
 * Client cgroups and jobs are short lists: one cgroup per distinct client cgroup, one job per
 * distinct key. A linear walk at connect and at a rule change is cheaper than a hash here.
 */
struct jobs {
	struct job_rule *rules; /* JOBS_RULES_MAX at most */
	size_t nrules;
	struct job *jobs;
	size_t njobs;
	struct job_cgroup *cgroups;
};

int jobs_new(struct jobs **ret)
{
	struct jobs *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	*ret = j;
	return 0;
}

static void job_free_all(struct jobs *j)
{
	while (j->jobs) {
		struct job *n = j->jobs->next;

		free(j->jobs->key);
		free(j->jobs);
		j->jobs = n;
	}
	j->njobs = 0;
}

void jobs_free(struct jobs *j)
{
	if (!j)
		return;
	job_free_all(j);
	while (j->cgroups) {
		struct job_cgroup *n = j->cgroups->next;

		free(j->cgroups->path);
		free(j->cgroups);
		j->cgroups = n;
	}
	for (size_t i = 0; i < j->nrules; i++)
		free(j->rules[i].pattern);
	free(j->rules);
	free(j);
}

/* Sets *err to a malloc'd message and returns r, so error paths stay one line. */
static int fail(char **err, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char **err, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(err, fmt, ap) < 0)
		*err = NULL;
	va_end(ap);
	return r;
}

/* ------------------------------------------------------------------ paths */

static unsigned components(const char *path)
{
	unsigned n = 0;

	for (const char *p = path; *p; p++)
		if (*p == '/' && p[1])
			n++;
	return n;
}

int jobs_path_check(const char *path, bool pattern, const char **why)
{
	size_t len = strlen(path);

	if (path[0] != '/') {
		*why = "a cgroup path starts with '/', as /proc/PID/cgroup writes it";
		return -EINVAL;
	}
	if (len >= JOBS_PATH_MAX) {
		*why = "the path is too long";
		return -EINVAL;
	}
	if (len > 1 && path[len - 1] == '/') {
		*why = "the path ends in '/'; leave it off";
		return -EINVAL;
	}
	for (const char *p = path; *p; p++) {
		if ((unsigned char)*p <= ' ' || *p == 0x7f || (!pattern && *p == ':')) {
			*why = "the path holds a blank or control character";
			return -EINVAL;
		}
		if (*p == '/' && p[1] == '/') {
			*why = "the path has an empty component ('//')";
			return -EINVAL;
		}
		if (*p == '/' && p[1] == '.' && (p[2] == '/' || !p[2] || (p[2] == '.' && (p[3] == '/' || !p[3])))) {
			*why = "the path has a '.' or '..' component";
			return -EINVAL;
		}
	}
	return 0;
}

bool jobs_pattern_matches(const char *pattern, const char *path)
{
	unsigned want = components(pattern), n = 0;
	char prefix[JOBS_PATH_MAX];
	const char *p = path;
	size_t len;

	if (want == 0)
		return true;
	for (; *p; p++)
		if (*p == '/' && p[1] && ++n > want)
			break;
	if (n < want)
		return false;
	len = (size_t)(p - path);
	if (len >= sizeof(prefix))
		return false;
	memcpy(prefix, path, len);
	prefix[len] = '\0';
	return fnmatch(pattern, prefix, FNM_PATHNAME | FNM_PERIOD) == 0;
}

int jobs_proc_cgroup_raw(const char *text, char *out, size_t outlen, bool *v1)
{
	const char *unified = NULL, *memory = NULL;
	size_t ulen = 0, mlen = 0;

	/* Lines are "ID:CONTROLLERS:PATH"; the unified one is "0::PATH". */
	for (const char *line = text; *line;) {
		const char *end = strchr(line, '\n'), *c1, *c2;
		size_t len = end ? (size_t)(end - line) : strlen(line);

		c1 = memchr(line, ':', len);
		c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
		if (c2) {
			const char *ctl = c1 + 1, *path = c2 + 1;
			size_t clen = (size_t)(c2 - ctl), plen = len - (size_t)(path - line);

			if (clen == 0 && c1 - line == 1 && line[0] == '0') {
				unified = path;
				ulen = plen;
			}
			/* "memory", alone or among comounted controllers. */
			for (const char *t = ctl; t < c2;) {
				const char *comma = memchr(t, ',', (size_t)(c2 - t));
				size_t tl = comma ? (size_t)(comma - t) : (size_t)(c2 - t);

				if (tl == 6 && memcmp(t, "memory", 6) == 0) {
					memory = path;
					mlen = plen;
				}
				t += tl + 1;
			}
		}
		line += len + (end ? 1 : 0);
	}

	/*
	 * The memory controller's root names no job: a hybrid host whose service manager keeps units out of v1
	 * memory cgroups (a container's systemd, given only the unified tree) tells its jobs apart there alone.
	 */
	if (memory && mlen == 1 && memory[0] == '/' && unified && ulen > 1)
		memory = NULL;

	const char *path = memory ? memory : unified;
	size_t plen = memory ? mlen : ulen;

	if (!path)
		return -ENOENT;
	if (plen >= outlen)
		return -EINVAL;
	memcpy(out, path, plen);
	out[plen] = '\0';
	if (v1)
		*v1 = memory != NULL;
	return 0;
}

int jobs_parse_proc_cgroup(const char *text, char *out, size_t outlen, bool *v1)
{
	const char *why;
	int r;

	r = jobs_proc_cgroup_raw(text, out, outlen, v1);
	if (r < 0)
		return r;
	return jobs_path_check(out, false, &why);
}

/* ----------------------------------------------------------- rule matching */

/*
 * Precedence (jobs.h): more components, then a SET rule over a CONFIG one, then a literal path over
 * a glob of its depth. Two rules never tie: a pattern has one rule per source.
 */
static bool rule_beats(const struct job_rule *a, const struct job_rule *b)
{
	if (!b)
		return true;
	if (a->ncomp != b->ncomp)
		return a->ncomp > b->ncomp;
	if (a->source != b->source)
		return a->source > b->source;
	return a->literal && !b->literal;
}

const struct job_rule *jobs_best_rule(const struct jobs *j, const char *path)
{
	const struct job_rule *best = NULL;

	for (size_t i = 0; i < j->nrules; i++) {
		const struct job_rule *r = &j->rules[i];

		if (jobs_pattern_matches(r->pattern, path) && rule_beats(r, best))
			best = r;
	}
	return best;
}

/*
 * The job for key (made if new, with rule); NULL without memory. A job found keeps the better of
 * its rule and rule: a literal rule's job is made before its cgroups are placed, and a SET rule of
 * the same path (or a deeper-ranked glob) must still be the one its quota comes from.
 */
static struct job *job_get(struct jobs *j, const char *key, const struct job_rule *rule)
{
	struct job *jb;

	for (jb = j->jobs; jb; jb = jb->next)
		if (strcmp(jb->key, key) == 0) {
			if (rule && rule_beats(rule, jb->rule))
				jb->rule = rule;
			return jb;
		}
	jb = calloc(1, sizeof(*jb));
	if (!jb || !(jb->key = strdup(key))) {
		free(jb);
		return NULL;
	}
	jb->rule = rule;
	jb->next = j->jobs;
	j->jobs = jb;
	j->njobs++;
	return jb;
}

/* Where cgroup path belongs: its best rule's first ncomp components, or itself. */
static struct job *job_for(struct jobs *j, const char *path)
{
	const struct job_rule *r = jobs_best_rule(j, path);
	char key[JOBS_PATH_MAX];

	if (!r)
		return job_get(j, path, NULL);
	if (r->ncomp == 0)
		return job_get(j, "/", r);
	/* The first ncomp components of path. */
	unsigned n = 0;
	const char *p = path;

	for (; *p; p++)
		if (*p == '/' && p[1] && ++n > r->ncomp)
			break;
	snprintf(key, sizeof(key), "%.*s", (int)(p - path), path);
	return job_get(j, key, r);
}

static void job_drop_if_unused(struct jobs *j, struct job *jb)
{
	if (jb->ncgroups || (jb->rule && jb->rule->literal))
		return;
	for (struct job **pp = &j->jobs; *pp; pp = &(*pp)->next)
		if (*pp == jb) {
			*pp = jb->next;
			free(jb->key);
			free(jb);
			j->njobs--;
			return;
		}
}

/*
 * Group every cgroup into jobs again after the rules changed (rules move in memory, so every
 * job's rule pointer is rebuilt). If memory runs out halfway, the cgroups not placed keep no job
 * (uncharged, unlimited) until the next regroup: a quota can loosen, never double-count.
 */
static void regroup(struct jobs *j)
{
	job_free_all(j);
	for (size_t i = 0; i < j->nrules; i++)
		if (j->rules[i].literal)
			job_get(j, j->rules[i].pattern, &j->rules[i]);
	for (struct job_cgroup *cg = j->cgroups; cg; cg = cg->next) {
		cg->job = job_for(j, cg->path);
		if (cg->job) {
			cg->job->ncgroups++;
			cg->job->bytes += cg->bytes;
			cg->job->leases += cg->leases;
		}
	}
}

/* --------------------------------------------------------------- cgroups */

int jobs_cgroup_get(struct jobs *j, const char *path, struct job_cgroup **ret)
{
	struct job_cgroup *cg;

	for (cg = j->cgroups; cg; cg = cg->next)
		if (strcmp(cg->path, path) == 0) {
			cg->refs++;
			*ret = cg;
			return 0;
		}
	cg = calloc(1, sizeof(*cg));
	if (!cg || !(cg->path = strdup(path))) {
		free(cg);
		return -ENOMEM;
	}
	cg->job = job_for(j, path);
	if (!cg->job) {
		free(cg->path);
		free(cg);
		return -ENOMEM;
	}
	cg->job->ncgroups++;
	/* A client in a literal rule's cgroup shows that cgroup exists: it is released once gone. */
	if (cg->job->rule && cg->job->rule->literal)
		((struct job_rule *)cg->job->rule)->seen = true;
	cg->refs = 1;
	cg->next = j->cgroups;
	j->cgroups = cg;
	*ret = cg;
	return 0;
}

void jobs_cgroup_put(struct jobs *j, struct job_cgroup *cg)
{
	if (!cg || --cg->refs > 0)
		return;
	for (struct job_cgroup **pp = &j->cgroups; *pp; pp = &(*pp)->next)
		if (*pp == cg) {
			*pp = cg->next;
			break;
		}
	if (cg->job) {
		cg->job->ncgroups--;
		job_drop_if_unused(j, cg->job);
	}
	free(cg->path);
	free(cg);
}

bool jobs_left(const struct job_cgroup *cg, uint64_t *limit, uint64_t *used, uint64_t *left)
{
	const struct job *jb = cg ? cg->job : NULL;

	if (!jb || !jb->rule)
		return false;
	*limit = jb->rule->bytes;
	*used = jb->bytes;
	*left = jb->bytes < jb->rule->bytes ? jb->rule->bytes - jb->bytes : 0;
	return true;
}

enum broker_refusal jobs_check(const struct job_cgroup *cg, uint64_t bytes)
{
	uint64_t limit, used, left;

	/* Over a lowered quota, nothing more fits, not even nothing. */
	if (jobs_left(cg, &limit, &used, &left) && (used > limit || bytes > left))
		return REFUSAL_JOB_QUOTA;
	return REFUSAL_NONE;
}

void jobs_charge(struct jobs *j, struct job_cgroup *cg, uint64_t bytes)
{
	(void)j;
	if (!cg)
		return;
	cg->refs++;
	cg->bytes += bytes;
	cg->leases++;
	if (cg->job) {
		cg->job->bytes += bytes;
		cg->job->leases++;
	}
}

void jobs_uncharge(struct jobs *j, struct job_cgroup *cg, uint64_t bytes)
{
	if (!cg)
		return;
	cg->bytes -= bytes;
	cg->leases--;
	if (cg->job) {
		cg->job->bytes -= bytes;
		cg->job->leases--;
	}
	jobs_cgroup_put(j, cg);
}

void jobs_move(struct jobs *j, struct job_cgroup *from, struct job_cgroup *to, uint64_t bytes)
{
	(void)j;
	if (from) {
		from->bytes -= bytes;
		if (from->job)
			from->job->bytes -= bytes;
	}
	if (to) {
		to->bytes += bytes;
		if (to->job)
			to->job->bytes += bytes;
	}
}

/* ----------------------------------------------------------------- rules */

static bool has_glob(const char *s)
{
	return strpbrk(s, "*?[\\") != NULL;
}

static struct job_rule *rule_find(struct jobs *j, const char *pattern, enum job_rule_source src)
{
	for (size_t i = 0; i < j->nrules; i++)
		if (j->rules[i].source == src && strcmp(j->rules[i].pattern, pattern) == 0)
			return &j->rules[i];
	return NULL;
}

/* Append a rule without regrouping. */
static int rule_add(struct jobs *j, const char *pattern, uint64_t bytes, enum job_rule_source src)
{
	struct job_rule *r = rule_find(j, pattern, src);

	if (r) {
		r->bytes = bytes;
		return 0;
	}
	if (j->nrules >= JOBS_RULES_MAX)
		return -ENOSPC;
	struct job_rule *n = realloc(j->rules, (j->nrules + 1) * sizeof(*n));

	if (!n)
		return -ENOMEM;
	j->rules = n;
	r = &j->rules[j->nrules];
	memset(r, 0, sizeof(*r));
	r->pattern = strdup(pattern);
	if (!r->pattern)
		return -ENOMEM;
	r->bytes = bytes;
	r->source = src;
	r->ncomp = components(pattern);
	r->literal = !has_glob(pattern);
	j->nrules++;
	return 0;
}

static void rule_remove_at(struct jobs *j, size_t i)
{
	free(j->rules[i].pattern);
	memmove(&j->rules[i], &j->rules[i + 1], (j->nrules - i - 1) * sizeof(j->rules[0]));
	j->nrules--;
}

int jobs_rule_set(struct jobs *j, const char *pattern, uint64_t bytes, enum job_rule_source src, const char **why)
{
	int r = jobs_path_check(pattern, true, why);

	if (r < 0)
		return r;
	r = rule_add(j, pattern, bytes, src);
	if (r == -ENOSPC)
		*why = "too many quota rules";
	regroup(j);
	return r;
}

int jobs_rule_clear(struct jobs *j, const char *pattern, enum job_rule_source *src)
{
	static const enum job_rule_source order[] = { JOB_RULE_SET, JOB_RULE_CONFIG };

	for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++)
		for (size_t i = 0; i < j->nrules; i++)
			if (j->rules[i].source == order[k] && strcmp(j->rules[i].pattern, pattern) == 0) {
				if (src)
					*src = order[k];
				rule_remove_at(j, i);
				regroup(j);
				return 0;
			}
	return -ENOENT;
}

int jobs_parse_config(const char *spec, uint64_t budget, int (*fn)(void *ctx, const char *pattern, uint64_t bytes),
		      void *ctx, char **err)
{
	const char *p = spec;
	size_t nentries = 0;

	*err = NULL;
	while (*p) {
		char entry[JOBS_PATH_MAX + 32], *colon;
		const char *why;
		size_t len;
		uint64_t bytes;
		double pct;
		bool is_pct;
		int r;

		p += strspn(p, " \t,");
		len = strcspn(p, " \t,");
		if (len == 0)
			break;
		if (len >= sizeof(entry))
			return fail(err, -EINVAL, "job-quota: the entry '%.40s...' is too long", p);
		memcpy(entry, p, len);
		entry[len] = '\0';
		p += len;
		if (++nentries > JOBS_RULES_MAX)
			return fail(err, -EINVAL,
				    "job-quota: more than %d entries; use a glob for many jobs of one shape",
				    JOBS_RULES_MAX);
		colon = strrchr(entry, ':');
		if (!colon)
			return fail(err, -EINVAL,
				    "job-quota: '%s' has no size; write CGROUP:SIZE, as /slurm/uid_*/job_*:8G", entry);
		*colon = '\0';
		if (jobs_path_check(entry, true, &why) < 0)
			return fail(err, -EINVAL, "job-quota: '%s': %s", entry, why);
		if (parse_size_or_pct(colon + 1, &bytes, &pct, &is_pct) < 0)
			return fail(
				err, -EINVAL,
				"job-quota: '%s' is not a size; use a number with K, M, G or T, or a percentage of the "
				"budget",
				colon + 1);
		if (is_pct)
			bytes = (uint64_t)((double)budget * pct / 100.0);
		if (fn && (r = fn(ctx, entry, bytes)) < 0)
			return fail(err, r, "job-quota: '%s': %s", entry,
				    r == -ENOSPC ? "too many quota rules" : strerror(-r));
	}
	return 0;
}

static int add_config_rule(void *ctx, const char *pattern, uint64_t bytes)
{
	return rule_add(ctx, pattern, bytes, JOB_RULE_CONFIG);
}

static int count_entry(void *ctx, const char *pattern, uint64_t bytes)
{
	(void)pattern;
	(void)bytes;
	++*(size_t *)ctx;
	return 0;
}

int jobs_set_config(struct jobs *j, const char *spec, uint64_t budget, char **err)
{
	size_t nconfig = 0, nset = 0;
	int r = jobs_parse_config(spec ? spec : "", budget, count_entry, &nconfig, err);

	if (r < 0)
		return r;
	/* Checked before anything is removed, so a refused spec leaves the old rules in force. */
	for (size_t i = 0; i < j->nrules; i++)
		nset += j->rules[i].source == JOB_RULE_SET;
	if (nconfig + nset > JOBS_RULES_MAX)
		return fail(err, -ENOSPC,
			    "job-quota: its %zu entries and the %zu rules set by pinctl quota set are more than %d; "
			    "clear some of those (pinctl quota clear) or shorten job-quota",
			    nconfig, nset, JOBS_RULES_MAX);
	for (size_t i = j->nrules; i-- > 0;)
		if (j->rules[i].source == JOB_RULE_CONFIG)
			rule_remove_at(j, i);
	/* Config rules first, in the file's order, then the SET ones as they were. */
	r = jobs_parse_config(spec ? spec : "", budget, add_config_rule, j, err);
	if (r == 0 && nset) {
		struct job_rule *tmp = malloc(nset * sizeof(*tmp));

		if (tmp) {
			memcpy(tmp, j->rules, nset * sizeof(*tmp));
			memmove(j->rules, j->rules + nset, (j->nrules - nset) * sizeof(*tmp));
			memcpy(j->rules + (j->nrules - nset), tmp, nset * sizeof(*tmp));
			free(tmp);
		}
	}
	regroup(j);
	return r;
}

size_t jobs_sweep(struct jobs *j, bool (*exists)(void *ctx, const char *path),
		  void (*gone)(void *ctx, const struct job_rule *rule), void *ctx)
{
	size_t removed = 0;

	for (size_t i = j->nrules; i-- > 0;) {
		struct job_rule *r = &j->rules[i];

		if (r->source != JOB_RULE_SET || !r->literal)
			continue;
		if (exists(ctx, r->pattern)) {
			r->seen = true;
			continue;
		}
		if (!r->seen)
			continue;
		if (gone)
			gone(ctx, r);
		rule_remove_at(j, i);
		removed++;
	}
	if (removed)
		regroup(j);
	return removed;
}

size_t jobs_rule_count(const struct jobs *j)
{
	return j->nrules;
}

const struct job_rule *jobs_rule_at(const struct jobs *j, size_t i)
{
	return i < j->nrules ? &j->rules[i] : NULL;
}

const struct job *jobs_first(const struct jobs *j)
{
	return j->jobs;
}

size_t jobs_count(const struct jobs *j)
{
	return j->njobs;
}

int jobs_rule_restore(struct jobs *j, const char *pattern, uint64_t bytes, bool seen, const char **why)
{
	struct job_rule *rule;
	int r = jobs_path_check(pattern, true, why);

	if (r < 0)
		return r;
	r = rule_add(j, pattern, bytes, JOB_RULE_SET);
	if (r == -ENOSPC)
		*why = "too many quota rules";
	if (r < 0)
		return r;
	rule = rule_find(j, pattern, JOB_RULE_SET);
	rule->seen = seen && rule->literal;
	return 0;
}

void jobs_regroup(struct jobs *j)
{
	regroup(j);
}
