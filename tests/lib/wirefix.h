/* SPDX-License-Identifier: MIT */
/* Requests the tests build themselves, as the library would send them (the request fixture's and raw clients'). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "pinbroker.pb-c.h"

/* A REPORT_STAGING of h2d_bytes in h2d_copies host-to-device copies in *req, its body in *rs (which outlives it). */
static inline void wirefix_report_staging(Pinbroker__V1__Request *req, Pinbroker__V1__ReportStaging *rs,
					  uint64_t h2d_bytes, uint64_t h2d_copies)
{
	*req = (Pinbroker__V1__Request)PINBROKER__V1__REQUEST__INIT;
	*rs = (Pinbroker__V1__ReportStaging)PINBROKER__V1__REPORT_STAGING__INIT;
	rs->has_h2d_bytes = rs->has_h2d_copies = true;
	rs->h2d_bytes = h2d_bytes;
	rs->h2d_copies = h2d_copies;
	req->body_case = PINBROKER__V1__REQUEST__BODY_REPORT_STAGING;
	req->report_staging = rs;
}
