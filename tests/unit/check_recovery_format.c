/* SPDX-License-Identifier: MIT */
/* Unit tests for the recovery state's format: round trips of leases, idle chunks and journal records, and truncated, corrupt and hostile states refused. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "recovery-format.h"
#include "check_main.h"

/* ------------------------------------------------------------ an in-memory state memfd */

struct img {
	unsigned char *p;
	size_t n;
};

static void img_put(struct img *im, uint64_t off, const void *p, size_t n)
{
	if (off + n > im->n) {
		im->p = realloc(im->p, off + n);
		ck_assert_ptr_nonnull(im->p);
		memset(im->p + im->n, 0, off + n - im->n);
		im->n = off + n;
	}
	memcpy(im->p + off, p, n);
}

static ssize_t img_read(void *ud, void *buf, size_t n, uint64_t off)
{
	const struct img *im = ud;

	if (off >= im->n)
		return 0;
	if (n > im->n - off)
		n = im->n - off;
	memcpy(buf, im->p + off, n);
	return (ssize_t)n;
}

/* Write body at off and commit it with a descriptor in slot, as the writer does. */
static void img_commit(struct img *im, int slot, uint64_t seq, uint64_t off, const struct recovery_buf *body)
{
	struct recovery_desc d;

	img_put(im, off, body->p, body->len);
	recovery_format_desc(&d, seq, 0xfeedull, 7, off, body->p, body->len);
	img_put(im, (uint64_t)slot * RECOVERY_DESC_BYTES, &d, sizeof(d));
}

/* Append a journal record at *end (8-aligned, as the writer does). */
static void img_record(struct img *im, uint64_t *end, uint64_t seq, const struct lease *l)
{
	struct recovery_buf rec = { 0 };

	ck_assert_int_eq(recovery_format_record(&rec, seq, l, NULL, 0), 0);
	img_put(im, *end, rec.p, rec.len);
	*end = recovery_format_align8(*end + rec.len);
	recovery_buf_free(&rec);
}

static int decode(struct img *im, struct recovery_parsed *out)
{
	return recovery_decode(im->n, img_read, im, out);
}

/* ------------------------------------------------------------ leases to write */

struct tlease {
	struct lease l;
	struct lease_chunk c[3];
	struct lease_attacher att[2];
};

static void tlease_init(struct tlease *t, uint64_t id, size_t nchunks)
{
	memset(t, 0, sizeof(*t));
	t->l.id = id;
	t->l.uid = 1000 + (uid_t)id;
	t->l.gid = 2000;
	t->l.pid = 4242;
	t->l.priority = LEASE_PRIO_NORMAL;
	for (size_t i = 0; i < nchunks; i++) {
		t->c[i].id = id * 10 + i + 1;
		t->c[i].bytes = 2u << 20;
		t->l.bytes += t->c[i].bytes;
	}
	t->l.chunks = t->c;
	t->l.nchunks = nchunks;
	snprintf(t->l.label, sizeof(t->l.label), "l%llu", (unsigned long long)id);
}

/* ------------------------------------------------------------ round trips */

START_TEST(test_lease_and_idle_round_trip_keeps_every_field)
{
	struct tlease t;
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };
	pid_t holds[2] = { 777, 778 };
	const struct recovery_stored_lease *sl;

	tlease_init(&t, 5, 3);
	t.c[2].tail = true;
	t.c[1].tainted = true;
	t.l.priority = LEASE_PRIO_BEST_EFFORT;
	/* Spaces, a newline and high bytes: the label is hex on the line, so all of it survives. */
	snprintf(t.l.label, sizeof(t.l.label), "a b\n\xff");
	t.l.no_revoke = true;
	t.att[0].pid = 501;
	t.att[1].pid = 502;
	t.l.attachers = t.att;
	t.l.nattachers = 2;
	recovery_format_lease(&body, &t.l, holds, 2);
	recovery_format_idle(&body, 99, 1234);
	ck_assert(!body.oom);
	img_commit(&im, 0, 1, RECOVERY_BODY_START_BYTES, &body);

	ck_assert_int_eq(decode(&im, &ps), 0);
	ck_assert_uint_eq(ps.nleases, 1);
	sl = &ps.leases[0];
	ck_assert_uint_eq(sl->id, 5);
	ck_assert_uint_eq(sl->uid, 1005);
	ck_assert_uint_eq(sl->gid, 2000);
	ck_assert_int_eq(sl->pid, 4242);
	ck_assert_uint_eq(sl->bytes, 3ull * (2u << 20));
	ck_assert_int_eq(sl->prio, LEASE_PRIO_BEST_EFFORT);
	ck_assert_uint_eq(sl->nchunks, 3);
	ck_assert_uint_eq(sl->chunk_ids[0], 51);
	ck_assert_uint_eq(sl->chunk_ids[2], 53);
	ck_assert(!sl->tails[0] && !sl->tails[1] && sl->tails[2]);
	ck_assert(!sl->tainted[0] && sl->tainted[1] && !sl->tainted[2]);
	ck_assert_str_eq(sl->label, "a b\n\xff");
	ck_assert(sl->no_revoke);
	ck_assert_uint_eq(sl->nmappers, 4);
	ck_assert_int_eq(sl->mappers[0], 501);
	ck_assert_int_eq(sl->mappers[1], 502);
	ck_assert_int_eq(sl->mappers[2], 777);
	ck_assert_int_eq(sl->mappers[3], 778);
	ck_assert_uint_eq(ps.nidle, 1);
	ck_assert_uint_eq(ps.idle_ids[0], 99);
	ck_assert_uint_eq(ps.idle_owner[0], 1234);
	ck_assert_uint_eq(ps.desc.seq, 1);
	ck_assert_uint_eq(ps.desc.instance_id, 0xfeed);
	ck_assert_uint_eq(ps.desc.max_lent_id, 7);
	ck_assert_uint_eq(ps.max_id, 5);
	ck_assert_int_eq(ps.slot, 0);
	recovery_parsed_free(&ps);
	recovery_buf_free(&body);
	free(im.p);
}
END_TEST

START_TEST(test_detached_holder_is_written_as_pid_0_and_plain_lease_has_no_options)
{
	struct tlease t;
	struct recovery_buf body = { 0 };

	tlease_init(&t, 3, 1);
	t.l.holder_detached = true;
	recovery_format_lease(&body, &t.l, NULL, 0);
	ck_assert_uint_eq(body.len, strlen("lease 3 1003 2000 0 2097152 0 1 31:0 L6c33\n"));
	ck_assert(memcmp(body.p, "lease 3 1003 2000 0 2097152 0 1 31:0 L6c33\n", body.len) == 0);
	recovery_buf_free(&body);
}
END_TEST

START_TEST(test_journal_records_follow_the_snapshot_in_order)
{
	struct tlease a, b, c;
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };
	uint64_t end;

	tlease_init(&a, 1, 1);
	tlease_init(&b, 9, 2);
	tlease_init(&c, 4, 1);
	recovery_format_lease(&body, &a.l, NULL, 0);
	img_commit(&im, 0, 3, RECOVERY_BODY_START_BYTES, &body);
	end = recovery_format_align8(RECOVERY_BODY_START_BYTES + body.len);
	img_record(&im, &end, 3, &b.l);
	img_record(&im, &end, 3, &c.l);

	ck_assert_int_eq(decode(&im, &ps), 0);
	ck_assert_uint_eq(ps.nleases, 3);
	ck_assert_uint_eq(ps.leases[0].id, 1);
	ck_assert_uint_eq(ps.leases[1].id, 9);
	ck_assert_uint_eq(ps.leases[1].nchunks, 2);
	ck_assert_uint_eq(ps.leases[2].id, 4);
	ck_assert_uint_eq(ps.max_id, 9);
	ck_assert_uint_eq(ps.journal_end, end);
	ck_assert_uint_gt(ps.journal_bytes, 0);
	recovery_parsed_free(&ps);
	recovery_buf_free(&body);
	free(im.p);
}
END_TEST

START_TEST(test_newest_descriptor_wins_and_a_torn_one_falls_back)
{
	struct tlease a, b;
	struct recovery_buf body1 = { 0 }, body2 = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };

	tlease_init(&a, 1, 1);
	tlease_init(&b, 2, 1);
	recovery_format_lease(&body1, &a.l, NULL, 0);
	recovery_format_lease(&body2, &b.l, NULL, 0);
	img_commit(&im, 1, 8, RECOVERY_BODY_START_BYTES, &body1);
	img_commit(&im, 0, 9, 4096, &body2);
	ck_assert_int_eq(decode(&im, &ps), 0);
	ck_assert_uint_eq(ps.desc.seq, 9);
	ck_assert_int_eq(ps.slot, 0);
	ck_assert_uint_eq(ps.leases[0].id, 2);
	recovery_parsed_free(&ps);

	/* A descriptor torn while being written: the other slot's committed snapshot is read. */
	im.p[20] ^= 1;
	ck_assert_int_eq(decode(&im, &ps), 0);
	ck_assert_uint_eq(ps.desc.seq, 8);
	ck_assert_int_eq(ps.slot, 1);
	ck_assert_uint_eq(ps.leases[0].id, 1);
	recovery_parsed_free(&ps);
	recovery_buf_free(&body1);
	recovery_buf_free(&body2);
	free(im.p);
}
END_TEST

/* ------------------------------------------------------------ refused */

START_TEST(test_empty_state_is_enodata)
{
	struct recovery_parsed ps;
	struct img im = { 0 };

	ck_assert_int_eq(decode(&im, &ps), -ENODATA);
	ck_assert_uint_eq(ps.nleases, 0);
}
END_TEST

START_TEST(test_poisoned_or_truncated_state_is_ebadmsg)
{
	struct tlease a;
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };
	unsigned char one = 0;

	/* The writer's poison: one byte. */
	img_put(&im, 0, &one, 1);
	ck_assert_int_eq(decode(&im, &ps), -EBADMSG);
	free(im.p);
	im = (struct img){ 0 };

	tlease_init(&a, 1, 2);
	recovery_format_lease(&body, &a.l, NULL, 0);
	img_commit(&im, 0, 1, RECOVERY_BODY_START_BYTES, &body);
	/* Cut inside the body: the descriptor names bytes the state does not have. */
	im.n = RECOVERY_BODY_START_BYTES + body.len - 1;
	ck_assert_int_eq(decode(&im, &ps), -EBADMSG);
	ck_assert_uint_eq(ps.nleases, 0);
	/* Cut inside the descriptor slot. */
	im.n = 60;
	ck_assert_int_eq(decode(&im, &ps), -EBADMSG);
	recovery_buf_free(&body);
	free(im.p);
}
END_TEST

START_TEST(test_corrupt_body_is_ebadmsg)
{
	struct tlease a;
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };

	tlease_init(&a, 1, 1);
	recovery_format_lease(&body, &a.l, NULL, 0);
	img_commit(&im, 0, 1, RECOVERY_BODY_START_BYTES, &body);
	im.p[RECOVERY_BODY_START_BYTES + 7] ^= 0x10;
	ck_assert_int_eq(decode(&im, &ps), -EBADMSG);
	ck_assert_uint_eq(ps.nleases, 0);
	recovery_buf_free(&body);
	free(im.p);
}
END_TEST

/* A body that checksums fine but is not this format: refused as a whole. */
static int decode_body_text(const char *text, size_t len)
{
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };
	int r;

	body.p = malloc(len ? len : 1);
	ck_assert_ptr_nonnull(body.p);
	memcpy(body.p, text, len);
	body.len = body.cap = len;
	img_commit(&im, 0, 1, RECOVERY_BODY_START_BYTES, &body);
	r = decode(&im, &ps);
	if (r == 0)
		recovery_parsed_free(&ps);
	else
		ck_assert_uint_eq(ps.nleases, 0);
	recovery_buf_free(&body);
	free(im.p);
	return r;
}

START_TEST(test_hostile_bodies_are_ebadmsg)
{
	ck_assert_int_eq(decode_body_text("idle 1 2\n", 9), 0);
	ck_assert_int_eq(decode_body_text("idle 1 2", 8), -EBADMSG);                      /* no final newline */
	ck_assert_int_eq(decode_body_text("idle 1 2 3\n", 11), -EBADMSG);                 /* trailing field */
	ck_assert_int_eq(decode_body_text("idle 1 2\0\n", 10), -EBADMSG);                 /* a NUL */
	ck_assert_int_eq(decode_body_text("lent 1 2\n", 9), -EBADMSG);                    /* unknown line */
	ck_assert_int_eq(decode_body_text("lease 1 0 0 1 4096 0 1 1:0\n", 27), -EBADMSG); /* no label */
}
END_TEST

static int parse_line(const char *text, struct recovery_stored_lease *sl)
{
	char line[4096];
	int r;

	snprintf(line, sizeof(line), "%s", text);
	r = recovery_parse_lease(line, sl);
	return r;
}

static void sl_free(struct recovery_stored_lease *sl)
{
	free(sl->chunk_ids);
	free(sl->tails);
	free(sl->tainted);
}

START_TEST(test_hostile_lease_lines_are_ebadmsg)
{
	static const char *bad[] = {
		"lease 0 1 1 1 4096 0 1 1:0 L",          /* id 0 */
		"lease 1 1 1 1 4096 0 0 L",              /* no chunks */
		"lease 1 1 1 1 4096 0 1000000000 1:0 L", /* a chunk count the line cannot hold */
		"lease 1 1 1 1 4096 3 1 1:0 L",          /* priority out of range */
		"lease 1 1 1 1 4096 -1 1 1:0 L",
		"lease 1 1 1 1 4096 0 2 1:0 L",               /* fewer chunks than counted */
		"lease 1 1 1 1 4096 0 1 1-0 L",               /* a chunk without flags */
		"lease 1 1 1 1 4096 0 1 1:0 X",               /* no label token */
		"lease 1 1 1 1 4096 0 1 1:0 L A0,",           /* pid 0 */
		"lease 1 1 1 1 4096 0 1 1:0 L A-5,",          /* negative pid */
		"lease 1 1 1 1 4096 0 1 1:0 L A5",            /* no comma */
		"lease 1 1 1 1 4096 0 1 1:0 L A99999999999,", /* past pid_t */
		"lease x",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct recovery_stored_lease sl;
		int r = parse_line(bad[i], &sl);

		ck_assert_msg(r == -EBADMSG, "\"%s\" gave %d", bad[i], r);
		sl_free(&sl);
	}
}
END_TEST

START_TEST(test_older_daemons_lines_and_unknown_flags_are_read_safely)
{
	struct recovery_stored_lease sl;

	/* Before the N and A options: just the label. */
	ck_assert_int_eq(parse_line("lease 7 1 2 3 4096 1 1 70:1 L", &sl), 0);
	ck_assert_uint_eq(sl.id, 7);
	ck_assert_int_eq(sl.prio, LEASE_PRIO_CRITICAL);
	ck_assert(sl.tails[0] && !sl.tainted[0]);
	ck_assert(!sl.no_revoke);
	ck_assert_uint_eq(sl.nmappers, 0);
	ck_assert_str_eq(sl.label, "");
	sl_free(&sl);
	/* A flag this daemon does not know: read as tainted, never pooled again. */
	ck_assert_int_eq(parse_line("lease 7 1 2 3 4096 0 1 70:4 L", &sl), 0);
	ck_assert(!sl.tails[0] && sl.tainted[0]);
	sl_free(&sl);
}
END_TEST

START_TEST(test_limits_mappers_and_label)
{
	struct tlease t;
	struct recovery_buf body = { 0 };
	struct lease_attacher att[RECOVERY_MAPPERS_MAX + 10];
	pid_t holds[10];
	struct recovery_stored_lease sl;
	char label_hex[2 * LEASE_LABEL_MAX + 64] = "lease 1 1 1 1 4096 0 1 1:0 L";
	size_t n = strlen(label_hex);

	tlease_init(&t, 1, 1);
	for (size_t i = 0; i < RECOVERY_MAPPERS_MAX + 10; i++)
		att[i].pid = (pid_t)(100 + i);
	for (size_t i = 0; i < 10; i++)
		holds[i] = (pid_t)(900 + i);
	t.l.attachers = att;
	t.l.nattachers = RECOVERY_MAPPERS_MAX + 10;
	recovery_format_lease(&body, &t.l, holds, 10);
	ck_assert(!body.oom);
	body.p[body.len - 1] = '\0';
	/* The writer keeps RECOVERY_MAPPERS_MAX pids: the first attachers, no holds past them. */
	ck_assert_int_eq(recovery_parse_lease(body.p, &sl), 0);
	ck_assert_uint_eq(sl.nmappers, RECOVERY_MAPPERS_MAX);
	ck_assert_int_eq(sl.mappers[RECOVERY_MAPPERS_MAX - 1], 100 + RECOVERY_MAPPERS_MAX - 1);
	ck_assert(strstr(body.p, ",900,") == NULL);
	sl_free(&sl);
	recovery_buf_free(&body);

	/* A label longer than any lease has: cut to LEASE_LABEL_MAX - 1 bytes. */
	for (size_t i = 0; i < LEASE_LABEL_MAX + 5; i++, n += 2)
		memcpy(label_hex + n, "41", 2);
	label_hex[n] = '\0';
	ck_assert_int_eq(recovery_parse_lease(label_hex, &sl), 0);
	ck_assert_uint_eq(strlen(sl.label), LEASE_LABEL_MAX - 1);
	sl_free(&sl);
}
END_TEST

START_TEST(test_descriptor_limits_are_ebadmsg)
{
	struct tlease a;
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };
	struct recovery_desc d;

	tlease_init(&a, 1, 1);
	recovery_format_lease(&body, &a.l, NULL, 0);
	img_put(&im, RECOVERY_BODY_START_BYTES, body.p, body.len);
	/* A body inside the descriptor slots. */
	recovery_format_desc(&d, 1, 1, 1, 64, im.p + 64, body.len);
	img_put(&im, 0, &d, sizeof(d));
	ck_assert_int_eq(decode(&im, &ps), -EBADMSG);
	/* A body longer than the sanity bound, even where the file is that long. */
	recovery_format_desc(&d, 1, 1, 1, RECOVERY_BODY_START_BYTES, body.p, body.len);
	d.body_len = RECOVERY_STATE_MAX_BYTES + 1;
	d.desc_sum = recovery_format_sum(1, &d, offsetof(struct recovery_desc, desc_sum));
	img_put(&im, 0, &d, sizeof(d));
	ck_assert_int_eq(recovery_decode(RECOVERY_STATE_MAX_BYTES * 2, img_read, &im, &ps), -EBADMSG);
	/* A wrong magic. */
	recovery_format_desc(&d, 1, 1, 1, RECOVERY_BODY_START_BYTES, body.p, body.len);
	d.magic[0] = 'X';
	d.desc_sum = recovery_format_sum(1, &d, offsetof(struct recovery_desc, desc_sum));
	img_put(&im, 0, &d, sizeof(d));
	ck_assert_int_eq(decode(&im, &ps), -EBADMSG);
	recovery_buf_free(&body);
	free(im.p);
}
END_TEST

START_TEST(test_torn_or_stale_record_ends_the_journal)
{
	struct tlease a, b, c;
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };
	uint64_t end, torn_at;

	tlease_init(&a, 1, 1);
	tlease_init(&b, 2, 1);
	tlease_init(&c, 3, 1);
	recovery_format_lease(&body, &a.l, NULL, 0);
	img_commit(&im, 0, 5, RECOVERY_BODY_START_BYTES, &body);
	end = recovery_format_align8(RECOVERY_BODY_START_BYTES + body.len);
	img_record(&im, &end, 5, &b.l);
	torn_at = end;
	img_record(&im, &end, 5, &c.l);
	/* Torn: its last bytes never landed right. What it described never left the daemon. */
	ck_assert_uint_lt(im.n, end + 1);
	im.p[im.n - 2] ^= 1;
	ck_assert_int_eq(decode(&im, &ps), 0);
	ck_assert_uint_eq(ps.nleases, 2);
	ck_assert_uint_eq(ps.journal_end, torn_at);
	recovery_parsed_free(&ps);

	/* Stale: a record of an older snapshot (seq 4) after this one's is not read. */
	end = torn_at;
	img_record(&im, &end, 4, &c.l);
	ck_assert_int_eq(decode(&im, &ps), 0);
	ck_assert_uint_eq(ps.nleases, 2);
	recovery_parsed_free(&ps);
	recovery_buf_free(&body);
	free(im.p);
}
END_TEST

START_TEST(test_checksummed_record_that_is_not_one_lease_line_is_ebadmsg)
{
	struct tlease a;
	struct recovery_buf body = { 0 };
	struct recovery_parsed ps;
	struct img im = { 0 };
	static const char *texts[] = { "idle 1 2\n", "lease 1 0 0 1 4096 0 1 1:0 L\nlease 2 0 0 1 4096 0 1 2:0 L\n",
				       "lease 1 0 0 1 4096 0 1 1:0 L" };

	tlease_init(&a, 1, 1);
	recovery_format_lease(&body, &a.l, NULL, 0);
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		struct recovery_record_hdr h = { .len = (uint32_t)strlen(texts[i]),
						 .tag = RECOVERY_RECORD_TAG,
						 .seq = 1 };
		uint64_t k[2] = { h.len, h.seq };
		uint64_t end;

		free(im.p);
		im = (struct img){ 0 };
		img_commit(&im, 0, 1, RECOVERY_BODY_START_BYTES, &body);
		end = recovery_format_align8(RECOVERY_BODY_START_BYTES + body.len);
		h.sum = recovery_format_sum(recovery_format_sum(2, k, sizeof(k)), texts[i], h.len);
		img_put(&im, end, &h, sizeof(h));
		img_put(&im, end + sizeof(h), texts[i], h.len);
		ck_assert_msg(decode(&im, &ps) == -EBADMSG, "record %zu accepted", i);
		ck_assert_uint_eq(ps.nleases, 0);
	}
	recovery_buf_free(&body);
	free(im.p);
}
END_TEST

CHECK_SUITE(recovery_format_suite, "recovery_format", "core", NULL, NULL, 30,
	    test_lease_and_idle_round_trip_keeps_every_field,
	    test_detached_holder_is_written_as_pid_0_and_plain_lease_has_no_options,
	    test_journal_records_follow_the_snapshot_in_order, test_newest_descriptor_wins_and_a_torn_one_falls_back,
	    test_empty_state_is_enodata, test_poisoned_or_truncated_state_is_ebadmsg, test_corrupt_body_is_ebadmsg,
	    test_hostile_bodies_are_ebadmsg, test_hostile_lease_lines_are_ebadmsg,
	    test_older_daemons_lines_and_unknown_flags_are_read_safely, test_limits_mappers_and_label,
	    test_descriptor_limits_are_ebadmsg, test_torn_or_stale_record_ends_the_journal,
	    test_checksummed_record_that_is_not_one_lease_line_is_ebadmsg)

CHECK_MAIN(recovery_format_suite)
