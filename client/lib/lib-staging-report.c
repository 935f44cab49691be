/* SPDX-License-Identifier: MIT */
/* Telling the daemon what a client's staged copies did (ReportStaging). */
#include "lib-int.h"

#include <errno.h>

/* a - b, counter by counter, 0 where b is ahead (counters a caller reset). */
static uint64_t since(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0;
}

int staging_report_send(pb_client *c, const struct pb_staging_stats *s)
{
	Pinbroker__V1__ReportStaging rs = PINBROKER__V1__REPORT_STAGING__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	struct pb_staging_stats base;
	uint64_t gen;
	int r;

	if (!c || !s)
		return -EINVAL;
	/* An older daemon closes a connection that sends a kind it does not know: it hears nothing. */
	if (!conn_knows_staging(c))
		return -EOPNOTSUPP;
	/* The daemon counts each connection from 0: a new one starts from what the last one was sent. */
	pthread_mutex_lock(&c->lock);
	if (c->staged_report.conn_gen != c->conn_gen) {
		c->staged_report.base = c->staged_report.sent;
		c->staged_report.conn_gen = c->conn_gen;
	}
	gen = c->conn_gen;
	base = c->staged_report.base;
	pthread_mutex_unlock(&c->lock);
	rs.has_h2d_bytes = rs.has_d2h_bytes = rs.has_h2d_copies = rs.has_d2h_copies = 1;
	rs.h2d_bytes = since(s->h2d_bytes, base.h2d_bytes);
	rs.d2h_bytes = since(s->d2h_bytes, base.d2h_bytes);
	rs.h2d_copies = since(s->h2d_copies, base.h2d_copies);
	rs.d2h_copies = since(s->d2h_copies, base.d2h_copies);
	rs.has_driver_copies = rs.has_ring_revoked = rs.has_ring_refused = rs.has_busy_ns = 1;
	rs.driver_copies = since(s->driver_copies, base.driver_copies);
	rs.ring_revoked = since(s->ring_revoked, base.ring_revoked);
	rs.ring_refused = since(s->ring_refused, base.ring_refused);
	rs.busy_ns = since(s->busy_ns, base.busy_ns);
	req.body_case = PINBROKER__V1__REQUEST__BODY_REPORT_STAGING;
	req.report_staging = &rs;
	r = conn_send_nowait(c, &req);
	if (r == 0) {
		pthread_mutex_lock(&c->lock);
		if (c->staged_report.conn_gen == gen)
			c->staged_report.sent = *s;
		pthread_mutex_unlock(&c->lock);
	}
	return r;
}
