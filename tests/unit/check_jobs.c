/* SPDX-License-Identifier: MIT */
/* Unit tests for per-job quotas (jobs.c): /proc/PID/cgroup parsing over captured layouts, rule matching and
 * precedence, the charges jobs sum, regrouping when rules change, the job-quota key, and the sweep. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "check_main.h"
#include "fixture.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)

static const char *fixture(const char *name)
{
	static char text[4096];

	return fixture_text("proc-cgroup", name, text, sizeof(text));
}

static struct jobs *new_jobs(void)
{
	struct jobs *j;

	ck_assert_int_eq(jobs_new(&j), 0);
	return j;
}

static void set_rule(struct jobs *j, const char *pattern, uint64_t bytes, enum job_rule_source src)
{
	const char *why = NULL;

	ck_assert_msg(jobs_rule_set(j, pattern, bytes, src, &why) == 0, "%s: %s", pattern, why ? why : "?");
}

START_TEST(test_proc_cgroup_layouts)
{
	char cg[JOBS_PATH_MAX];
	bool v1;

	ck_assert_int_eq(jobs_parse_proc_cgroup(fixture("v2-slurm"), cg, sizeof(cg), &v1), 0);
	ck_assert_str_eq(cg, "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0");
	ck_assert(!v1);
	/* On a hybrid host the v1 memory controller's path wins over the unified line (slurmd's own unit). */
	ck_assert_int_eq(jobs_parse_proc_cgroup(fixture("v1-slurm"), cg, sizeof(cg), &v1), 0);
	ck_assert_str_eq(cg, "/slurm/uid_1000/job_42/step_0/task_0");
	ck_assert(v1);
	ck_assert_int_eq(jobs_parse_proc_cgroup(fixture("v1-comounted-memory"), cg, sizeof(cg), &v1), 0);
	ck_assert_str_eq(cg, "/docker/0123456789ab");
	ck_assert_int_eq(jobs_parse_proc_cgroup(fixture("v2-kubepods"), cg, sizeof(cg), NULL), 0);
	ck_assert_ptr_nonnull(strstr(cg, "/kubepods.slice/kubepods-burstable.slice/"));
	ck_assert_int_eq(jobs_parse_proc_cgroup(fixture("v1-no-memory"), cg, sizeof(cg), NULL), -ENOENT);
	ck_assert_int_eq(jobs_parse_proc_cgroup(fixture("v2-odd-path"), cg, sizeof(cg), NULL), -EINVAL);
	ck_assert_int_eq(jobs_parse_proc_cgroup("", cg, sizeof(cg), NULL), -ENOENT);
	/* Too long for the buffer: refused, not cut. */
	ck_assert_int_eq(jobs_parse_proc_cgroup("0::/abcdefgh\n", cg, 8, NULL), -EINVAL);
	/* A hybrid host whose v1 memory tree is not used for units (a container's systemd): the unified path. */
	ck_assert_int_eq(jobs_parse_proc_cgroup("4:memory:/\n1:name=systemd:/system.slice/pb-job.service\n"
						"0::/system.slice/pb-job.service\n",
						cg, sizeof(cg), &v1),
			 0);
	ck_assert_str_eq(cg, "/system.slice/pb-job.service");
	ck_assert(!v1);
	/* Both at the root: the root, as before. */
	ck_assert_int_eq(jobs_parse_proc_cgroup("4:memory:/\n0::/\n", cg, sizeof(cg), &v1), 0);
	ck_assert_str_eq(cg, "/");
	/* The captured host's text always names something: v1 memory or unified. */
	ck_assert_int_eq(jobs_parse_proc_cgroup(fixture("hybrid-this-host"), cg, sizeof(cg), NULL), 0);
	ck_assert_int_eq(cg[0], '/');
}
END_TEST

START_TEST(test_paths_and_patterns_are_checked)
{
	const char *why;

	ck_assert_int_eq(jobs_path_check("/a/b", false, &why), 0);
	ck_assert_int_eq(jobs_path_check("/", false, &why), 0);
	ck_assert_int_eq(jobs_path_check("/kubepods.slice/*", true, &why), 0);
	ck_assert_int_eq(jobs_path_check("a/b", true, &why), -EINVAL);
	ck_assert_int_eq(jobs_path_check("/a/", true, &why), -EINVAL);
	ck_assert_int_eq(jobs_path_check("/a//b", true, &why), -EINVAL);
	ck_assert_int_eq(jobs_path_check("/a/../b", true, &why), -EINVAL);
	ck_assert_int_eq(jobs_path_check("/a/.", true, &why), -EINVAL);
	ck_assert_int_eq(jobs_path_check("/a b", true, &why), -EINVAL);
	ck_assert_int_eq(jobs_path_check("/a\nb", true, &why), -EINVAL);
	ck_assert_ptr_nonnull(why);
	/* ".x" is a name, not a dot component. */
	ck_assert_int_eq(jobs_path_check("/a/.x", true, &why), 0);
}
END_TEST

START_TEST(test_patterns_match_leading_components)
{
	ck_assert(jobs_pattern_matches("/a/b", "/a/b"));
	ck_assert(jobs_pattern_matches("/a/b", "/a/b/c/d"));
	ck_assert(!jobs_pattern_matches("/a/b", "/a/bc"));
	ck_assert(!jobs_pattern_matches("/a/b", "/a"));
	ck_assert(jobs_pattern_matches("/a/*", "/a/x/y"));
	ck_assert(!jobs_pattern_matches("/a/*", "/b/x"));
	ck_assert(jobs_pattern_matches("/slurm/uid_*/job_*", "/slurm/uid_1000/job_42/step_0"));
	ck_assert(!jobs_pattern_matches("/slurm/uid_*/job_*", "/slurm/uid_1000/step_0"));
	ck_assert(jobs_pattern_matches("/", "/anything/at/all"));
	/* A glob never spans a '/'. */
	ck_assert(!jobs_pattern_matches("/a*b", "/a/b"));
	ck_assert(jobs_pattern_matches("/a*", "/a/b")); /* "/a" matches, and "/a/b" is inside it */
	ck_assert(jobs_pattern_matches("/a*", "/ab/c"));
}
END_TEST

START_TEST(test_cgroups_are_interned_and_charges_sum_into_jobs)
{
	struct jobs *j = new_jobs();
	struct job_cgroup *a, *a2, *b;

	ck_assert_int_eq(jobs_cgroup_get(j, "/j/1/step_0", &a), 0);
	ck_assert_int_eq(jobs_cgroup_get(j, "/j/1/step_0", &a2), 0);
	ck_assert_ptr_eq(a, a2);
	ck_assert_uint_eq(a->refs, 2);
	ck_assert_int_eq(jobs_cgroup_get(j, "/j/1/step_1", &b), 0);
	/* Without a rule each cgroup is its own job, without a quota. */
	ck_assert_ptr_ne(a->job, b->job);
	ck_assert_ptr_null(a->job->rule);
	ck_assert_int_eq(jobs_check(a, 100 * GIB), REFUSAL_NONE);

	set_rule(j, "/j/1", 64 * MIB, JOB_RULE_SET);
	/* Both steps now sum into the rule's job. */
	ck_assert_ptr_eq(a->job, b->job);
	ck_assert_str_eq(a->job->key, "/j/1");
	jobs_charge(j, a, 40 * MIB);
	ck_assert_int_eq(jobs_check(b, 24 * MIB), REFUSAL_NONE);
	ck_assert_int_eq(jobs_check(b, 24 * MIB + 1), REFUSAL_JOB_QUOTA);
	jobs_charge(j, b, 24 * MIB);
	ck_assert_uint_eq(a->job->bytes, 64 * MIB);
	ck_assert_uint_eq(a->job->leases, 2);
	ck_assert_int_eq(jobs_check(a, 1), REFUSAL_JOB_QUOTA);

	/* Clearing regroups: each step is its own unlimited job again, keeping its own charge. */
	ck_assert_int_eq(jobs_rule_clear(j, "/j/1", NULL), 0);
	ck_assert_ptr_ne(a->job, b->job);
	ck_assert_uint_eq(a->job->bytes, 40 * MIB);
	ck_assert_uint_eq(b->job->bytes, 24 * MIB);
	ck_assert_int_eq(jobs_rule_clear(j, "/j/1", NULL), -ENOENT);

	/* A lease holds its cgroup: the connection's references can go first. */
	jobs_cgroup_put(j, a);
	jobs_cgroup_put(j, a2);
	ck_assert_uint_eq(a->refs, 1);
	jobs_uncharge(j, a, 40 * MIB); /* frees a */
	jobs_uncharge(j, b, 24 * MIB);
	jobs_cgroup_put(j, b);
	ck_assert_ptr_null(jobs_first(j));
	ck_assert_uint_eq(jobs_count(j), 0);
	jobs_free(j);
}
END_TEST

START_TEST(test_most_specific_rule_wins_and_set_beats_config)
{
	struct jobs *j = new_jobs();
	struct job_cgroup *pod1, *pod2, *other;

	set_rule(j, "/kubepods.slice/*", 16 * GIB, JOB_RULE_CONFIG);
	ck_assert_int_eq(jobs_cgroup_get(j, "/kubepods.slice/pod1/ctr", &pod1), 0);
	ck_assert_int_eq(jobs_cgroup_get(j, "/kubepods.slice/pod2/ctr", &pod2), 0);
	ck_assert_int_eq(jobs_cgroup_get(j, "/system.slice/x", &other), 0);
	/* A glob rule gives each match its own job and quota. */
	ck_assert_str_eq(pod1->job->key, "/kubepods.slice/pod1");
	ck_assert_str_eq(pod2->job->key, "/kubepods.slice/pod2");
	ck_assert_uint_eq(pod1->job->rule->bytes, 16 * GIB);
	ck_assert_ptr_null(other->job->rule);

	/* Deeper wins. */
	set_rule(j, "/kubepods.slice/pod1/ctr", 1 * GIB, JOB_RULE_CONFIG);
	ck_assert_str_eq(pod1->job->key, "/kubepods.slice/pod1/ctr");
	ck_assert_uint_eq(pod1->job->rule->bytes, 1 * GIB);
	/* Same depth: the rule set at run time beats the config's. */
	set_rule(j, "/kubepods.slice/pod2", 2 * GIB, JOB_RULE_SET);
	ck_assert_uint_eq(pod2->job->rule->bytes, 2 * GIB);
	ck_assert_int_eq(pod2->job->rule->source, JOB_RULE_SET);
	/* Setting the same pattern again replaces its size. */
	set_rule(j, "/kubepods.slice/pod2", 3 * GIB, JOB_RULE_SET);
	ck_assert_uint_eq(jobs_rule_count(j), 3);
	ck_assert_uint_eq(pod2->job->rule->bytes, 3 * GIB);
	/* A literal rule's job is listed with nothing charged yet. */
	bool listed = false;
	for (const struct job *jb = jobs_first(j); jb; jb = jb->next)
		listed = listed || strcmp(jb->key, "/kubepods.slice/pod2") == 0;
	ck_assert(listed);
	jobs_cgroup_put(j, pod1);
	jobs_cgroup_put(j, pod2);
	jobs_cgroup_put(j, other);
	jobs_free(j);
}
END_TEST

/* A literal rule makes its job before any cgroup joins it: that job must still take the winning rule. */
START_TEST(test_set_rule_beats_a_literal_config_rule_of_the_same_path)
{
	struct jobs *j = new_jobs();
	struct job_cgroup *cg, *other;

	set_rule(j, "/fleet.slice/job_1", 24 * MIB, JOB_RULE_CONFIG);
	set_rule(j, "/fleet.slice/job_2", 24 * MIB, JOB_RULE_CONFIG);
	ck_assert_int_eq(jobs_cgroup_get(j, "/fleet.slice/job_1", &cg), 0);
	jobs_charge(j, cg, 16 * MIB);
	ck_assert_int_eq(jobs_check(cg, 12 * MIB), REFUSAL_JOB_QUOTA);
	/* pinctl quota set of the same path raises it. */
	set_rule(j, "/fleet.slice/job_1", 40 * MIB, JOB_RULE_SET);
	ck_assert_int_eq(cg->job->rule->source, JOB_RULE_SET);
	ck_assert_uint_eq(cg->job->rule->bytes, 40 * MIB);
	ck_assert_int_eq(jobs_check(cg, 12 * MIB), REFUSAL_NONE);
	for (const struct job *jb = jobs_first(j); jb; jb = jb->next)
		if (strcmp(jb->key, "/fleet.slice/job_1") == 0)
			ck_assert_int_eq(jb->rule->source, JOB_RULE_SET);
	/* A client that joins later gets the same job and rule. */
	ck_assert_int_eq(jobs_cgroup_get(j, "/fleet.slice/job_1", &other), 0);
	ck_assert_ptr_eq(other, cg);
	jobs_cgroup_put(j, other);
	/* A glob set at run time beats a literal config rule of its depth too, for the cgroups charged. */
	ck_assert_int_eq(jobs_cgroup_get(j, "/fleet.slice/job_2/step_0", &other), 0);
	set_rule(j, "/fleet.slice/*", 8 * MIB, JOB_RULE_SET);
	ck_assert_str_eq(other->job->key, "/fleet.slice/job_2");
	ck_assert_str_eq(other->job->rule->pattern, "/fleet.slice/*");
	ck_assert_int_eq(jobs_check(other, 10 * MIB), REFUSAL_JOB_QUOTA);
	jobs_cgroup_put(j, other);
	/* Clearing the set rules brings the config's back. */
	ck_assert_int_eq(jobs_rule_clear(j, "/fleet.slice/*", NULL), 0);
	ck_assert_int_eq(jobs_rule_clear(j, "/fleet.slice/job_1", NULL), 0);
	ck_assert_int_eq(cg->job->rule->source, JOB_RULE_CONFIG);
	ck_assert_int_eq(jobs_check(cg, 12 * MIB), REFUSAL_JOB_QUOTA);
	jobs_uncharge(j, cg, 16 * MIB);
	jobs_cgroup_put(j, cg);
	jobs_free(j);
}
END_TEST

START_TEST(test_lowering_a_quota_refuses_new_charges_only)
{
	struct jobs *j = new_jobs();
	struct job_cgroup *cg;

	set_rule(j, "/job", 100 * MIB, JOB_RULE_SET);
	ck_assert_int_eq(jobs_cgroup_get(j, "/job", &cg), 0);
	jobs_charge(j, cg, 80 * MIB);
	set_rule(j, "/job", 50 * MIB, JOB_RULE_SET);
	ck_assert_uint_eq(cg->job->bytes, 80 * MIB); /* kept: nothing double-counted or lost */
	ck_assert_int_eq(jobs_check(cg, 1), REFUSAL_JOB_QUOTA);
	jobs_uncharge(j, cg, 80 * MIB);
	ck_assert_int_eq(jobs_check(cg, 50 * MIB), REFUSAL_NONE);
	jobs_cgroup_put(j, cg);
	jobs_free(j);
}
END_TEST

START_TEST(test_job_quota_key_parses_and_names_its_errors)
{
	struct jobs *j = new_jobs();
	char *err = NULL;

	ck_assert_int_eq(
		jobs_set_config(j, "/kubepods.slice/*:16G  /slurm/uid_*/job_*:10%,/batch:512M", 10 * GIB, &err), 0);
	ck_assert_uint_eq(jobs_rule_count(j), 3);
	ck_assert_str_eq(jobs_rule_at(j, 0)->pattern, "/kubepods.slice/*");
	ck_assert_uint_eq(jobs_rule_at(j, 0)->bytes, 16 * GIB);
	ck_assert_uint_eq(jobs_rule_at(j, 1)->bytes, 1 * GIB); /* 10% of 10G */
	ck_assert_uint_eq(jobs_rule_at(j, 2)->bytes, 512 * MIB);

	/* A reload replaces the config's rules and keeps the ones set at run time. */
	set_rule(j, "/mine", 1 * MIB, JOB_RULE_SET);
	ck_assert_int_eq(jobs_set_config(j, "/batch:1G", 10 * GIB, &err), 0);
	ck_assert_uint_eq(jobs_rule_count(j), 2);
	ck_assert_str_eq(jobs_rule_at(j, 0)->pattern, "/batch");
	ck_assert_str_eq(jobs_rule_at(j, 1)->pattern, "/mine");

	/* Errors name the entry, and change nothing. */
	ck_assert_int_eq(jobs_set_config(j, "/ok:1G /nosize", 0, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "/nosize"));
	free(err);
	ck_assert_int_eq(jobs_set_config(j, "relative:1G", 0, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "starts with '/'"));
	free(err);
	ck_assert_int_eq(jobs_set_config(j, "/a:12Q", 0, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "not a size"));
	free(err);
	ck_assert_uint_eq(jobs_rule_count(j), 2);
	ck_assert_int_eq(jobs_set_config(j, "", 0, &err), 0);
	ck_assert_uint_eq(jobs_rule_count(j), 1);
	jobs_free(j);
}
END_TEST

static const char *existing;

static bool fake_exists(void *ctx, const char *path)
{
	(void)ctx;
	return existing && strcmp(path, existing) == 0;
}

static int gone_count;

static void fake_gone(void *ctx, const struct job_rule *r)
{
	(void)ctx;
	(void)r;
	gone_count++;
}

START_TEST(test_sweep_releases_set_rules_once_their_cgroup_went)
{
	struct jobs *j = new_jobs();
	char *err = NULL;

	set_rule(j, "/job_1", 1 * GIB, JOB_RULE_SET);
	set_rule(j, "/job_*", 1 * GIB, JOB_RULE_SET);
	ck_assert_int_eq(jobs_set_config(j, "/cfg:1G", 0, &err), 0);
	/* Not seen yet (a prolog runs before the job's cgroup exists): kept. */
	existing = NULL;
	ck_assert_uint_eq(jobs_sweep(j, fake_exists, fake_gone, NULL), 0);
	existing = "/job_1";
	ck_assert_uint_eq(jobs_sweep(j, fake_exists, fake_gone, NULL), 0);
	ck_assert(jobs_rule_at(j, 1)->seen || jobs_rule_at(j, 0)->seen);
	/* Gone after it was seen: released. Glob and config rules never are. */
	existing = NULL;
	gone_count = 0;
	ck_assert_uint_eq(jobs_sweep(j, fake_exists, fake_gone, NULL), 1);
	ck_assert_int_eq(gone_count, 1);
	ck_assert_uint_eq(jobs_rule_count(j), 2);
	for (size_t i = 0; i < jobs_rule_count(j); i++)
		ck_assert_str_ne(jobs_rule_at(j, i)->pattern, "/job_1");
	jobs_free(j);
}
END_TEST

START_TEST(test_a_client_in_the_cgroup_marks_a_rule_seen)
{
	struct jobs *j = new_jobs();
	struct job_cgroup *cg;

	set_rule(j, "/job_7", 1 * GIB, JOB_RULE_SET);
	ck_assert(!jobs_rule_at(j, 0)->seen);
	ck_assert_int_eq(jobs_cgroup_get(j, "/job_7/step_0", &cg), 0);
	ck_assert(jobs_rule_at(j, 0)->seen);
	jobs_cgroup_put(j, cg);
	existing = NULL;
	ck_assert_uint_eq(jobs_sweep(j, fake_exists, NULL, NULL), 1);
	jobs_free(j);
}
END_TEST

START_TEST(test_rule_count_is_bounded)
{
	struct jobs *j = new_jobs();
	const char *why = NULL;
	char p[32];

	for (int i = 0; i < JOBS_RULES_MAX; i++) {
		snprintf(p, sizeof(p), "/j%d", i);
		set_rule(j, p, 1, JOB_RULE_SET);
	}
	ck_assert_int_eq(jobs_rule_set(j, "/one-more", 1, JOB_RULE_SET, &why), -ENOSPC);
	ck_assert_ptr_nonnull(why);
	/* Replacing one still works at the limit. */
	ck_assert_int_eq(jobs_rule_set(j, "/j0", 2, JOB_RULE_SET, &why), 0);
	jobs_free(j);
}
END_TEST

/* Regression: a literal rule's job was made with the first rule of its path, the config's, so a
 * pinctl quota set of that same path showed and bound nothing. */
START_TEST(test_a_set_rule_binds_over_a_config_rule_of_the_same_path)
{
	struct jobs *j = new_jobs();
	struct job_cgroup *c, *d;
	char *err = NULL;

	ck_assert_int_eq(jobs_set_config(j, "/slurm/job_1:8G", 64 * GIB, &err), 0);
	ck_assert_int_eq(jobs_cgroup_get(j, "/slurm/job_1/step_0", &c), 0);
	ck_assert_int_eq(jobs_cgroup_get(j, "/slurm/job_1/step_1", &d), 0);
	jobs_charge(j, c, 2 * MIB);
	jobs_charge(j, d, 1 * MIB);
	set_rule(j, "/slurm/job_1", 4 * MIB, JOB_RULE_SET);
	ck_assert_ptr_eq(c->job, d->job);
	ck_assert_int_eq(c->job->rule->source, JOB_RULE_SET);
	ck_assert_uint_eq(c->job->rule->bytes, 4 * MIB);
	ck_assert_uint_eq(c->job->bytes, 3 * MIB);
	ck_assert_int_eq(jobs_check(c, 2 * MIB), REFUSAL_JOB_QUOTA);
	ck_assert_int_eq(jobs_check(c, 1 * MIB), REFUSAL_NONE);
	/* A reload re-adds the config rule first: the set one still binds. */
	ck_assert_int_eq(jobs_set_config(j, "/slurm/job_1:8G", 64 * GIB, &err), 0);
	ck_assert_int_eq(c->job->rule->source, JOB_RULE_SET);
	ck_assert_int_eq(jobs_check(d, 2 * MIB), REFUSAL_JOB_QUOTA);
	ck_assert_uint_eq(c->job->bytes, 3 * MIB);
	/* Cleared, the config's applies again, with the same bytes. */
	ck_assert_int_eq(jobs_rule_clear(j, "/slurm/job_1", NULL), 0);
	ck_assert_int_eq(c->job->rule->source, JOB_RULE_CONFIG);
	ck_assert_uint_eq(c->job->bytes, 3 * MIB);
	ck_assert_int_eq(jobs_check(c, 2 * MIB), REFUSAL_NONE);
	jobs_uncharge(j, c, 2 * MIB);
	jobs_uncharge(j, d, 1 * MIB);
	ck_assert_uint_eq(c->job->bytes, 0);
	jobs_cgroup_put(j, c);
	jobs_cgroup_put(j, d);
	jobs_free(j);
}
END_TEST

/* A glob and a literal path of one depth and source: the literal, more specific, wins, whichever came first. */
START_TEST(test_a_literal_rule_beats_a_glob_of_its_depth)
{
	static const char *const specs[] = { "/pods/*:8G /pods/p1:4M", "/pods/p1:4M /pods/*:8G" };

	for (size_t k = 0; k < 2; k++) {
		struct jobs *j = new_jobs();
		struct job_cgroup *p1, *p2;
		char *err = NULL;

		ck_assert_int_eq(jobs_set_config(j, specs[k], 64 * GIB, &err), 0);
		ck_assert_int_eq(jobs_cgroup_get(j, "/pods/p1/ctr", &p1), 0);
		ck_assert_int_eq(jobs_cgroup_get(j, "/pods/p2/ctr", &p2), 0);
		ck_assert_str_eq(p1->job->rule->pattern, "/pods/p1");
		ck_assert_str_eq(jobs_best_rule(j, "/pods/p1/x")->pattern, "/pods/p1");
		ck_assert_str_eq(p2->job->rule->pattern, "/pods/*");
		ck_assert_int_eq(jobs_check(p1, 8 * MIB), REFUSAL_JOB_QUOTA);
		ck_assert_int_eq(jobs_check(p2, 8 * MIB), REFUSAL_NONE);
		jobs_cgroup_put(j, p1);
		jobs_cgroup_put(j, p2);
		jobs_free(j);
	}
}
END_TEST

/* Regression: job-quota took any number of entries, and a reload past the rule limit half-applied. */
START_TEST(test_job_quota_key_past_the_rule_limit_is_refused_whole)
{
	struct jobs *j = new_jobs();
	size_t len = (size_t)(JOBS_RULES_MAX + 1) * 16;
	char *spec = malloc(len), *err = NULL, p[32];
	size_t off = 0;

	for (int i = 0; i <= JOBS_RULES_MAX; i++)
		off += (size_t)snprintf(spec + off, len - off, "/j%d:1G ", i);
	ck_assert_int_eq(jobs_parse_config(spec, 0, NULL, NULL, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "more than"));
	free(err);
	err = NULL;

	/* 1000 set rules, then a config of 100 entries: refused, and the old config rule stays. */
	ck_assert_int_eq(jobs_set_config(j, "/old:1G", 0, &err), 0);
	for (int i = 0; i < 1000; i++) {
		snprintf(p, sizeof(p), "/s%d", i);
		set_rule(j, p, 1, JOB_RULE_SET);
	}
	off = 0;
	for (int i = 0; i < 100; i++)
		off += (size_t)snprintf(spec + off, len - off, "/c%d:1G ", i);
	ck_assert_int_eq(jobs_set_config(j, spec, 0, &err), -ENOSPC);
	ck_assert_ptr_nonnull(strstr(err, "pinctl quota clear"));
	free(err);
	ck_assert_uint_eq(jobs_rule_count(j), 1001);
	ck_assert_str_eq(jobs_rule_at(j, 0)->pattern, "/old");
	for (size_t i = 0; i < jobs_rule_count(j); i++)
		ck_assert_msg(strncmp(jobs_rule_at(j, i)->pattern, "/c", 2) != 0, "%s half-applied",
			      jobs_rule_at(j, i)->pattern);
	free(spec);
	jobs_free(j);
}
END_TEST

/* JOBS_RULES_MAX rules, each set regrouping every job: seconds under ASan. */
CHECK_SUITE(suite, "jobs", "quotas", NULL, NULL, 60, test_proc_cgroup_layouts, test_paths_and_patterns_are_checked,
	    test_patterns_match_leading_components, test_cgroups_are_interned_and_charges_sum_into_jobs,
	    test_most_specific_rule_wins_and_set_beats_config,
	    test_set_rule_beats_a_literal_config_rule_of_the_same_path, test_lowering_a_quota_refuses_new_charges_only,
	    test_job_quota_key_parses_and_names_its_errors, test_sweep_releases_set_rules_once_their_cgroup_went,
	    test_a_client_in_the_cgroup_marks_a_rule_seen, test_rule_count_is_bounded,
	    test_a_set_rule_binds_over_a_config_rule_of_the_same_path, test_a_literal_rule_beats_a_glob_of_its_depth,
	    test_job_quota_key_past_the_rule_limit_is_refused_whole)

CHECK_MAIN(suite)
