/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: the request decoder and request_dispatch against an in-memory broker, with accounting checked after every packet. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "request.h"

/*
 * Input: one flags byte (bit i: connection i is uid 0; bit 2: the many-leases
 * profile, see harness.h), then operations until the input ends. An operation
 * is one byte, op:
 *   op & 7 in 0..2  a packet for connection (op >> 3) & 1: a length byte L
 *                   (bit 7 set: a second length byte follows, L = 15 bits),
 *                   then L bytes handed to request_dispatch;
 *   3               requests in bulk on connection (op >> 3) & 1: acquire
 *                   bursts, id sweeps, release of every id seen, clock jumps
 *                   (fz_bulk_op in harness.h);
 *   4               drain both peers (replies are decoded and checked);
 *   5               pressure state (op >> 3) % 3;
 *   6               run the loop once (flush queues, due timers); with op & 8, first
 *                   move the clock on 3 ms so short acquire and revoke timeouts expire;
 *   7               close our end of connection (op >> 3) & 1: later sends fail.
 * fuzz/gen_corpus.c writes seeds in this format.
 */

static bool take(const uint8_t **p, const uint8_t *end, size_t n)
{
	if ((size_t)(end - *p) < n)
		return false;
	*p += n;
	return true;
}

static void dispatch(struct fz *f, int i, const uint8_t *pkt, size_t len)
{
	request_dispatch(fz_conn(f, i), pkt, len);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fz_global_init(NULL);
	return 0;
}

/* Ops 0-2: one packet of up to 32 KiB (a length byte, two with its top bit set), dispatched as the daemon reads it. */
static void packet_op(struct fz *f, uint8_t op, int i, const uint8_t **p, const uint8_t *end)
{
	const uint8_t *pkt;
	size_t len;

	(void)op;
	if (*p >= end)
		return;
	len = *(*p)++;
	if (len & 0x80) {
		if (*p >= end)
			return;
		len = ((len & 0x7f) << 8) | *(*p)++;
	}
	if ((size_t)(end - *p) < len)
		len = (size_t)(end - *p);
	pkt = *p;
	take(p, end, len);
	dispatch(f, i, pkt, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return fz_run_input(data, size, packet_op, dispatch);
}
