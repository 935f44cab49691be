/* SPDX-License-Identifier: MIT */
/* Linked against the installed libpinbroker.a: no daemon, so connect fails and acquire falls back. */
#include <errno.h>
#include <pinbroker.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	pb_client *c = NULL;
	pb_lease *l;
	int r;

	if (argc != 2) {
		fprintf(stderr, "usage: %s MISSING_SOCKET_PATH\n", argv[0]);
		return 2;
	}
	r = pb_connect(argv[1], &c);
	if (r != -ENOENT) {
		fprintf(stderr, "pb_connect(%s) returned %d, expected -ENOENT (%d)\n", argv[1], r, -ENOENT);
		return 1;
	}
	l = pb_acquire_or_fallback(c, 1 << 20, NULL);
	if (!l || pb_lease_kind(l) != PB_MEM_FALLBACK || pb_lease_size(l) < (1 << 20)) {
		fprintf(stderr, "pb_acquire_or_fallback without a daemon did not return 1 MiB of fallback memory\n");
		return 1;
	}
	memset(pb_lease_data(l), 0x5a, 1 << 20);
	printf("fallback: %s\n", pb_lease_fallback_reason(l));
	r = pb_release(NULL, l);
	if (r < 0) {
		fprintf(stderr, "pb_release of a fallback lease returned %d\n", r);
		return 1;
	}
	return 0;
}
