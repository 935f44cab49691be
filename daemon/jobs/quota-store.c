/* SPDX-License-Identifier: MIT */
/* The quota rules file's I/O: read at start, written on each change of the set rules (quota-store.h). */
#define _GNU_SOURCE
#include "quota-store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "config.h"
#include "daemon.h"
#include "jobs.h"
#include "log.h"
#include "quota-rules.h"
#include "util.h"

#define STORE_NAME "quota-rules"
/* After a failed write, a sweep tries again no sooner than this: about one sweep interval (jobs-watch.h). */
#define RETRY_US 4000000u

struct quota_store {
	char path[PATH_MAX]; /* "" when it does not fit: nothing is kept */
	char *saved;         /* the text the file holds as far as this daemon knows; NULL: unknown, write it */
	int failed;          /* the errno of the last failed write, 0 after one that worked: logged once a cause */
	uint64_t failed_us;  /* when it failed (now_us) */
	char boot_id[QUOTA_RULES_BOOT_ID_MAX]; /* this boot's, written in the file; "" when unknown */
};

int quota_store_path(const struct config *cfg, char *buf, size_t len)
{
	const char *rt = getenv("RUNTIME_DIRECTORY");
	int n;

	if (rt && rt[0] == '/')
		/* systemd sets it for RuntimeDirectory= (kept across stops): its first entry, as restart.c does. */
		n = snprintf(buf, len, "%.*s/%s", (int)strcspn(rt, ":"), rt, STORE_NAME);
	else
		n = snprintf(buf, len, "%s.%s", cfg->socket_path, STORE_NAME);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/*
 * Remove the temp files ("<path>.XXXXXX", regular, this uid's) of writes a crash cut short before their rename:
 * each would stay until a reboot (kill -9 in a quota set storm left one in 3 of 40 kills on the build host).
 */
static void remove_leftovers(const char *path)
{
	char dir[PATH_MAX], *slash;
	const char *base;
	struct dirent *e;
	size_t blen;
	int n = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		return;
	base = path + (slash - dir) + 1;
	blen = strlen(base);
	*(slash == dir ? slash + 1 : slash) = '\0';
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d))) {
		static const char xs[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
		struct stat st;

		if (strncmp(e->d_name, base, blen) != 0 || e->d_name[blen] != '.' ||
		    strlen(e->d_name + blen + 1) != 6 || strspn(e->d_name + blen + 1, xs) != 6)
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
		    st.st_uid != geteuid())
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == 0)
			n++;
	}
	closedir(d);
	if (n > 0)
		log_info("removed %d temporary quota rules file%s (%s.XXXXXX) that a stop while writing left", n,
			 n == 1 ? "" : "s", path);
}

static void warn_line(void *ctx, unsigned line, const char *what)
{
	log_warnx("%s:%u: %s", (const char *)ctx, line, what);
}

int quota_store_start(struct broker *b)
{
	struct quota_store *qs;
	const char *why = NULL;
	char *text = NULL;
	size_t len = 0;
	int r, n;

	if (!b->jobs)
		return 0;
	qs = calloc(1, sizeof(*qs));
	if (!qs)
		return -ENOMEM;
	daemon_of(b)->quota_store = qs;
	read_boot_id(daemon_of(b)->cfg->proc_root, qs->boot_id, sizeof(qs->boot_id));
	if (quota_store_path(daemon_of(b)->cfg, qs->path, sizeof(qs->path)) < 0) {
		log_warnx("the quota rules file's path is too long: rules set with pinctl quota set will not survive a "
			  "restart; use a shorter socket path");
		qs->path[0] = '\0';
		return 0;
	}
	remove_leftovers(qs->path);
	/* Only this daemon's uid writes it, as one name; rules from another could lift a job's bound. */
	r = read_private_file(qs->path, QUOTA_RULES_MAX_BYTES, &text, &len, &why);
	if (r == -ENOENT) {
		log_debug("no quota rules file %s: no rules set with pinctl quota set to restore", qs->path);
	} else if (r == -EPERM) {
		log_warnx("ignoring the quota rules file %s: %s; rules set with pinctl quota set before this start are "
			  "not restored (set them again; the next change replaces the file)",
			  qs->path, why);
	} else if (r < 0) {
		log_warnx("cannot read the quota rules file %s (%s): rules set with pinctl quota set before this start "
			  "are not restored (set them again)",
			  qs->path, strerror(-r));
	} else {
		n = quota_rules_load(b->jobs, text, len, qs->boot_id, warn_line, qs->path);
		if (n == -ENOMEM)
			log_warnx("out of memory reading the quota rules file %s: some rules are not restored",
				  qs->path);
		else if (n > 0)
			log_info("%d job quota rule%s restored from %s (pinctl quota list shows them)", n,
				 n == 1 ? "" : "s", qs->path);
		b->generation++;
	}
	free(text);
	/* What the file now means: a file with bad lines is rewritten at the next change, not before. */
	if (quota_rules_format(b->jobs, qs->boot_id, &qs->saved, &len) < 0)
		qs->saved = NULL;
	return 0;
}

/* Write text (len bytes) to qs->path through a fresh temp file, or remove the file for "". 0 or -errno. */
static int write_rules(const struct quota_store *qs, const char *text, size_t len)
{
	char tmp[PATH_MAX + 8], dir[PATH_MAX], *slash;
	size_t done = 0;
	int fd, dfd, r = 0;

	if (len == 0)
		return unlink(qs->path) < 0 && errno != ENOENT ? -errno : 0;
	snprintf(tmp, sizeof(tmp), "%s.XXXXXX", qs->path);
	/* mkostemp: a new file of mode 0600, never one planted at a guessable name. */
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (done < len) {
		ssize_t w = write(fd, text + done, len - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			r = -errno;
			break;
		}
		if (w == 0) {
			r = -EIO;
			break;
		}
		done += (size_t)w;
	}
	if (r == 0 && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, qs->path) < 0)
		r = -errno;
	if (r < 0) {
		unlink(tmp);
		return r;
	}
	/* The rename itself lasts past a power cut only once its folder is synced; /run forgets it anyway. */
	snprintf(dir, sizeof(dir), "%s", qs->path);
	slash = strrchr(dir, '/');
	if (slash) {
		*(slash == dir ? slash + 1 : slash) = '\0';
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			(void)fsync(dfd);
			close(dfd);
		}
	}
	return 0;
}

int quota_store_save(struct broker *b, char *why, size_t whylen)
{
	struct quota_store *qs = daemon_of(b)->quota_store;
	char *text = NULL;
	size_t len = 0;
	int r;

	if (!qs || !b->jobs)
		return 0;
	if (!qs->path[0]) {
		if (why)
			snprintf(why, whylen, "the rules file's path is too long");
		return -ENAMETOOLONG;
	}
	r = quota_rules_format(b->jobs, qs->boot_id, &text, &len);
	if (r < 0) {
		if (why)
			snprintf(why, whylen, "out of memory");
		return r;
	}
	if (qs->saved && strcmp(qs->saved, text) == 0) {
		free(text);
		return 0;
	}
	r = write_rules(qs, text, len);
	if (r < 0) {
		if (-r != qs->failed)
			log_warnx("cannot write the quota rules file %s: %s; the rules in force now are lost at a "
				  "restart "
				  "until it can be written (tried again at each change and every few seconds)",
				  qs->path, strerror(-r));
		qs->failed = -r;
		qs->failed_us = now_us();
		if (why)
			snprintf(why, whylen, "cannot write %s: %s", qs->path, strerror(-r));
		free(text);
		return r;
	}
	if (qs->failed)
		log_info("the quota rules file %s is written again", qs->path);
	qs->failed = 0;
	free(qs->saved);
	qs->saved = text;
	return 0;
}

void quota_store_sweep(struct broker *b)
{
	const struct quota_store *qs = daemon_of(b)->quota_store;

	/* Any uid's quota list sweeps: while writes fail, it must not buy a write, and its fsync, each. */
	if (qs && qs->failed && now_us() - qs->failed_us < RETRY_US)
		return;
	(void)quota_store_save(b, NULL, 0);
}

void quota_store_stop(struct broker *b)
{
	if (!daemon_of(b)->quota_store)
		return;
	free(daemon_of(b)->quota_store->saved);
	free(daemon_of(b)->quota_store);
	daemon_of(b)->quota_store = NULL;
}
