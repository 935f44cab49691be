/* SPDX-License-Identifier: MIT */
/* Borrow pinned memory from pinbrokerd, or ordinary memory when it refuses or is not running: acquire SIZE, fill it, give it back. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
	struct pb_acquire_opts opts = { .priority = PB_PRIORITY_NORMAL, .label = "example" };
	size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)64 << 20;
	pb_client *c = NULL;
	pb_lease *l;
	int r;

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
