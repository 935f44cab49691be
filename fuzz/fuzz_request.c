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
 * Input: one flags byte (bit i: connection i is uid 0), then operations until
 * the input ends. An operation is one byte, op:
 *   op & 7 in 0..3  a packet for connection (op >> 3) & 1: a length byte L
 *                   (bit 7 set: a second length byte follows, L = 15 bits),
 *                   then L bytes handed to request_dispatch;
 *   4               drain both peers (replies are decoded and checked);
 *   5               pressure state (op >> 3) % 3;
 *   6               run the loop once (flush queues, due timers); with op & 8, first
 *                   sleep 3 ms so short acquire and revoke timeouts expire;
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

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fz_global_init();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int baseline_fds;
	const uint8_t *p = data, *end = data + size;
	struct fz f;

	if (size < 1)
		return 0;
	/* Counted per input: libFuzzer's symbolizer opens pipes between inputs. */
	baseline_fds = fz_count_fds();
	fz_setup(&f, data[0], NULL);
	p++;
	while (p < end) {
		uint8_t op = *p++;
		int i = (op >> 3) & 1;

		switch (op & 7) {
		case 0: case 1: case 2: case 3: {
			size_t len;
			const uint8_t *pkt;
			struct conn *c;

			if (p >= end)
				break;
			len = *p++;
			if (len & 0x80) {
				if (p >= end)
					break;
				len = ((len & 0x7f) << 8) | *p++;
			}
			if ((size_t)(end - p) < len)
				len = (size_t)(end - p);
			pkt = p;
			take(&p, end, len);
			c = fz_conn(&f, i);
			request_dispatch(c, pkt, len);
			break;
		}
		default:
			fz_common_op(&f, op, i);
			break;
		}
		fz_check(&f);
	}
	fz_finish(&f, baseline_fds);
	return 0;
}
