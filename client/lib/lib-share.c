/* SPDX-License-Identifier: MIT */
/* libpinbroker's sharing: a token for a held lease (pb_lease_share), a lease attached by token (pb_attach). */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <string.h>

int pb_lease_share(pb_client *c, pb_lease *l, const uid_t *uids, size_t nuids, char token[PB_SHARE_TOKEN_LEN])
{
	Pinbroker__V1__Share sh = PINBROKER__V1__SHARE__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint32_t wire_uids[32];
	struct waiter w;
	uint64_t gen;
	int r;

	if (!l || !token)
		return err_set(-EINVAL, "pb_lease_share: lease or token is NULL");
	token[0] = '\0';
	if (!l->client)
		return err_set(-EINVAL, "this lease is ordinary memory (%s): only broker leases can be shared",
			       l->fallback_reason ? l->fallback_reason : "fallback");
	if (nuids > 32 || (nuids > 0 && !uids))
		return err_set(-EINVAL, "a lease may be shared with at most 32 uids besides its holder's");
	c = l->client;
	pthread_mutex_lock(&c->lock);
	r = 0;
	if (l->attached)
		r = err_set(-EINVAL, "lease %llu is attached, not held, here: only its holder can share it",
			    (unsigned long long)l->id);
	else if (l->state != LEASE_ACTIVE)
		r = err_set(-EINVAL, "lease %llu was released or revoked: it cannot be shared",
			    (unsigned long long)l->id);
	else if (lease_is_stale(l) || l->conn_gen != c->conn_gen)
		r = err_set(-EINVAL, "lease %llu is from a pinbrokerd that is gone: acquire again to share",
			    (unsigned long long)l->id);
	gen = l->conn_gen;
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	for (size_t i = 0; i < nuids; i++)
		wire_uids[i] = (uint32_t)uids[i];
	sh.lease_id = l->id;
	sh.n_uids = nuids;
	sh.uids = wire_uids;
	req.body_case = PINBROKER__V1__REQUEST__BODY_SHARE;
	req.share = &sh;
	r = conn_call(c, &req, &w, false, gen);
	if (r == -ESTALE)
		return err_set(-EINVAL,
			       "lease %llu is from a pinbrokerd connection that is gone: acquire again to share",
			       (unsigned long long)l->id);
	if (r < 0)
		return r;
	if (w.reply->status != PINBROKER__V1__STATUS_CODE__STATUS_OK)
		r = err_reply(w.reply);
	else if (w.reply->body_case != PINBROKER__V1__REPLY__BODY_SHARE || !w.reply->share->token ||
		 strlen(w.reply->share->token) != PB_SHARE_TOKEN_LEN - 1)
		r = err_set(-EPROTO, "pinbrokerd answered SHARE without a valid token");
	if (r == 0) {
		memcpy(token, w.reply->share->token, PB_SHARE_TOKEN_LEN);
		pthread_mutex_lock(&c->lock);
		l->shared = true;
		pthread_mutex_unlock(&c->lock);
	}
	conn_waiter_cleanup(&w);
	return r;
}

int pb_attach(pb_client *c, const char *token, pb_lease **ret)
{
	return pb_attach_opts(c, token, NULL, ret);
}

int pb_attach_opts(pb_client *c, const char *token, const struct pb_acquire_opts *opts, pb_lease **ret)
{
	Pinbroker__V1__Attach at = PINBROKER__V1__ATTACH__INIT;
	Request req = PINBROKER__V1__REQUEST__INIT;
	uint32_t flags = opts ? opts->flags : 0;

	if (flags & ~(PB_ACQUIRE_NO_CUDA | PB_ACQUIRE_MAPPED))
		return err_set(-EINVAL, "pb_attach_opts: flags may hold PB_ACQUIRE_NO_CUDA and PB_ACQUIRE_MAPPED only");
	if (!ret)
		return err_set(-EINVAL, "pb_attach: ret is NULL");
	*ret = NULL;
	if (!c)
		return err_set(-ENOTCONN, "not connected to a broker");
	if (!token || strnlen(token, PB_SHARE_TOKEN_LEN) != PB_SHARE_TOKEN_LEN - 1)
		return err_set(-ENOENT, "a share token is %d hex characters", PB_SHARE_TOKEN_LEN - 1);
	at.token = (char *)token;
	req.body_case = PINBROKER__V1__REQUEST__BODY_ATTACH;
	req.attach = &at;
	return acquire_call(c, &req, "ATTACH", flags, true, NULL, ret);
}

int pb_lease_attached(const pb_lease *l)
{
	return l && l->attached;
}
