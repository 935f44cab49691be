/* SPDX-License-Identifier: MIT */
/* Telling the daemon what a client's staged copies did (ReportStaging). */
#include "lib-int.h"

#include <errno.h>

int lib_report_staging(pb_client *c, const struct pb_staging_stats *s)
{
	Pinbroker__V1__ReportStaging rs = PINBROKER__V1__REPORT_STAGING__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;

	if (!c || !s)
		return -EINVAL;
	/* An older daemon closes a connection that sends a kind it does not know: it hears nothing. */
	if (!conn_knows_staging(c))
		return -EOPNOTSUPP;
	rs.has_h2d_bytes = rs.has_d2h_bytes = rs.has_h2d_copies = rs.has_d2h_copies = 1;
	rs.h2d_bytes = s->h2d_bytes;
	rs.d2h_bytes = s->d2h_bytes;
	rs.h2d_copies = s->h2d_copies;
	rs.d2h_copies = s->d2h_copies;
	rs.has_driver_copies = rs.has_ring_revoked = rs.has_ring_refused = rs.has_busy_ns = 1;
	rs.driver_copies = s->driver_copies;
	rs.ring_revoked = s->ring_revoked;
	rs.ring_refused = s->ring_refused;
	rs.busy_ns = s->busy_ns;
	req.body_case = PINBROKER__V1__REQUEST__BODY_REPORT_STAGING;
	req.report_staging = &rs;
	return conn_send_nowait(c, &req);
}
