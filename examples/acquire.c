/* SPDX-License-Identifier: MIT */
/* Borrow pinned memory from pinbrokerd, or ordinary memory when it refuses or is not running: acquire SIZE, fill it, give it back. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include <pinbroker.h> /* cc acquire.c $(pkg-config --cflags --libs pinbroker) */

static const char *kind_name(enum pb_memory_kind k)
{
	switch (k) {
	case PB_MEM_PINNED:
		return "pinned and CUDA-registered";
	case PB_MEM_LOCKED:
		return "locked, not CUDA-registered (no usable CUDA here)";
	case PB_MEM_FALLBACK:
		return "ordinary pageable memory";
	case PB_MEM_REVOKED:
	default:
		return "revoked";
	}
}

/* Called on the library's thread when the daemon wants the memory back: this example just says so. */
static int on_revoke(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *userdata)
{
	fprintf(stderr, "acquire: the broker asks for lease %llu back within %u ms\n",
		(unsigned long long)pb_lease_id(l), deadline_ms);
	return 0;
}

/*
 * SIZE as pinctl and pinbrokerd.conf read it (common/util.c's parse_size, which the library does not export): a
 * decimal number with an optional K, M, G or T suffix, powers of 1024 ("KiB", "MB" and friends too, any case).
 * Returns 0 and sets *ret, or -1.
 */
static int parse_size(const char *s, size_t *ret)
{
	static const struct {
		const char *name;
		unsigned shift;
	} suffixes[] = {
		{ "", 0 },     { "B", 0 },  { "K", 10 },  { "KB", 10 },  { "KIB", 10 }, { "M", 20 },  { "MB", 20 },
		{ "MIB", 20 }, { "G", 30 }, { "GB", 30 }, { "GIB", 30 }, { "T", 40 },   { "TB", 40 }, { "TIB", 40 },
	};
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++)
		if (strcasecmp(end, suffixes[i].name) == 0) {
			if (v > (SIZE_MAX >> suffixes[i].shift))
				return -1;
			*ret = (size_t)v << suffixes[i].shift;
			return 0;
		}
	return -1;
}

int main(int argc, char **argv)
{
	struct pb_acquire_opts opts = { .priority = PB_PRIORITY_NORMAL, .label = "example" };
	size_t size = (size_t)64 << 20;
	pb_client *c = NULL;
	pb_lease *l;
	int r;

	if (argc > 2 || (argc == 2 && parse_size(argv[1], &size) < 0)) {
		fprintf(stderr,
			"usage: %s [SIZE]   SIZE in bytes, or with K, M, G or T (powers of 1024): 64M, 1G; "
			"default 64M\n",
			argv[0]);
		return 2;
	}

	printf("libpinbroker %s (header %d.%d.%d)\n", pb_version(), PINBROKER_VERSION_MAJOR, PINBROKER_VERSION_MINOR,
	       PINBROKER_VERSION_PATCH);
	/* NULL: $PINBROKER_SOCKET, else the default socket. Failing is fine: c stays NULL and we fall back. */
	r = pb_connect(NULL, &c);
	if (r < 0)
		fprintf(stderr, "acquire: no broker (%s); falling back to ordinary memory\n", pb_last_error());
	else
		pb_set_revoke_callback(c, on_revoke, NULL);

	l = pb_acquire_or_fallback(c, size, &opts);
	if (!l) {
		fprintf(stderr, "acquire: %s\n", pb_last_error());
		pb_disconnect(c);
		return EXIT_FAILURE;
	}
	printf("%zu bytes at %p: %s", pb_lease_size(l), pb_lease_data(l), kind_name(pb_lease_kind(l)));
	if (pb_lease_kind(l) == PB_MEM_FALLBACK)
		printf(" (%s)", pb_lease_fallback_reason(l));
	printf("\n");

	/* Here a real program would cudaMemcpyAsync from the buffer; this one only writes it. */
	memset(pb_lease_data(l), 0xa5, pb_lease_size(l));

	r = pb_release(c, l);
	if (r < 0)
		fprintf(stderr, "acquire: release: %s\n", strerror(-r));
	pb_disconnect(c);
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
