/* SPDX-License-Identifier: MIT */
/* Requests the tests build themselves, as the library would send them (the request fixture's and raw clients'). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

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

/*
 * Puts body in msg's oneof field kind, as setting the generated body_case and union member would (protobuf-c numbers
 * a oneof's cases by their fields): one call for any Request or Reply body.
 */
static inline void wirefix_set_oneof(ProtobufCMessage *msg, uint32_t kind, ProtobufCMessage *body)
{
	const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(msg->descriptor, kind);

	if (!f || !f->quantifier_offset)
		abort(); /* not a oneof field of msg: the test is wrong */
	*(uint32_t *)((char *)msg + f->quantifier_offset) = kind;
	*(ProtobufCMessage **)((char *)msg + f->offset) = body;
}
