/* SPDX-License-Identifier: MIT */
/* Runs a fuzz harness's entry point over corpus files and directories without libFuzzer: the regression test. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long len;

	if (!f) {
		perror(path);
		return -1;
	}
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(len > 0 ? (size_t)len : 1);
	if (!buf || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
		fprintf(stderr, "%s: cannot read\n", path);
		fclose(f);
		free(buf);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)len);
	free(buf);
	return 0;
}

static int cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * Returns files run, or -1. A named path that is missing is an error: a moved or misspelt corpus
 * folder would otherwise replay nothing and pass. An empty folder is fine (no regressions yet).
 */
static int run_path(const char *path)
{
	struct stat st;
	struct dirent *e;
	char **names = NULL;
	size_t n = 0;
	int ran = 0;
	DIR *d;

	if (stat(path, &st) < 0) {
		fprintf(stderr,
			"%s: %m: a corpus named on the command line must exist (create it empty if it has no "
			"inputs yet)\n",
			path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode))
		return run_file(path) == 0 ? 1 : -1;
	d = opendir(path);
	if (!d) {
		perror(path);
		return -1;
	}
	while ((e = readdir(d))) {
		char **nn;

		if (e->d_name[0] == '.' || strcmp(e->d_name, "README") == 0)
			continue;
		nn = realloc(names, (n + 1) * sizeof(*names));
		if (!nn)
			return -1;
		names = nn;
		if (asprintf(&names[n++], "%s/%s", path, e->d_name) < 0)
			return -1;
	}
	closedir(d);
	qsort(names, n, sizeof(*names), cmp);
	for (size_t i = 0; i < n; i++) {
		if (run_file(names[i]) < 0)
			return -1;
		ran++;
		free(names[i]);
	}
	free(names);
	return ran;
}

int main(int argc, char **argv)
{
	int total = 0;

	LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++) {
		int r = run_path(argv[i]);

		if (r < 0)
			return 1;
		total += r;
	}
	/* A replay of nothing proves nothing: every corpus named being empty is a broken setup, not a pass. */
	if (total == 0) {
		fprintf(stderr, "%s: no inputs in any corpus named\n", argv[0]);
		return 1;
	}
	printf("%s: %d inputs ran clean\n", argv[0], total);
	return 0;
}
