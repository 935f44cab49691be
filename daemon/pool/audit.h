/* SPDX-License-Identifier: MIT */
/*
 * The pool's hole-punch audit: a timer checking a bounded slice of chunks per tick, and the report of each punch found.
 */
#pragma once

struct broker;
struct audit;

/*
 * Report every punched chunk the pool finds (pool.h: on release, at adoption and
 * in the audit) as a memory-punched event naming the lease, uid and pid, and
 * start the periodic audit of the pool's chunks on the daemon's loop. Needs the daemon's pool,
 * b->leases and the daemon's loop. Returns 0 and *ret, or -ENOMEM.
 */
int audit_new(struct broker *b, struct audit **ret);
/* Stop the audit and the reports. NULL is fine. */
void audit_free(struct audit *a);
