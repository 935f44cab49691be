/* SPDX-License-Identifier: MIT */
/* A connection's counters of what it maps, kept as it gains and loses leases, so its status row needs no walk. */
#include "conn.h"

#include <stdio.h>
#include <string.h>

static void status_conn_add(struct conn *c, const struct lease *l)
{
	struct conn_label *free_slot = NULL;

	c->lease_bytes += l->bytes;
	if (!l->label[0])
		return;
	for (size_t i = 0; i < CONN_LABELS_MAX; i++) {
		struct conn_label *s = &c->labels[i];

		if (s->leases && strcmp(s->text, l->label) == 0) {
			s->leases++;
			return;
		}
		if (!s->leases && !free_slot)
			free_slot = s;
	}
	/* A full set lists no more: the lease rows still carry every label. */
	if (free_slot) {
		snprintf(free_slot->text, sizeof(free_slot->text), "%s", l->label);
		free_slot->leases = 1;
	}
}

static void status_conn_remove(struct conn *c, const struct lease *l)
{
	c->lease_bytes = c->lease_bytes > l->bytes ? c->lease_bytes - l->bytes : 0;
	if (!l->label[0])
		return;
	for (size_t i = 0; i < CONN_LABELS_MAX; i++) {
		struct conn_label *s = &c->labels[i];

		if (s->leases && strcmp(s->text, l->label) == 0) {
			s->leases--;
			return;
		}
	}
}

void conn_gain(struct conn *c, const struct lease *l, bool attached)
{
	c->nleases++;
	if (attached)
		c->nattached++;
	else if (l->staging_ring) {
		c->rings++;
		c->ring_bytes += l->bytes;
	}
	status_conn_add(c, l);
}

void conn_lose(struct conn *c, const struct lease *l, bool attached)
{
	if (c->nleases > 0) {
		c->nleases--;
		status_conn_remove(c, l);
	}
	if (attached && c->nattached > 0)
		c->nattached--;
	else if (!attached && l->staging_ring && c->rings > 0) {
		c->rings--;
		c->ring_bytes -= l->bytes;
	}
}
