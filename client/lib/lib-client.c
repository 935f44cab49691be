/* SPDX-License-Identifier: MIT */
/* libpinbroker's client: pb_connect builds one and wires its rooms together; pb_disconnect takes it down. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

static void client_free(pb_client *c)
{
	if (c->sock >= 0)
		close(c->sock);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	free(c->away_ids);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	pthread_rwlock_destroy(&c->sock_lock);
	free(c->rxbuf);
	free(c);
}

int pb_connect(const char *path, pb_client **ret)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	pb_client *c;
	int r;

	if (!ret)
		return err_set(-EINVAL, "pb_connect: ret is NULL");
	*ret = NULL;
	if (!path || !*path)
		path = secure_getenv(PB_SOCKET_ENV);
	if (!path || !*path)
		path = PB_DEFAULT_SOCKET;
	if (strlen(path) >= sizeof(sa.sun_path)) {
		r = err_set(-ENAMETOOLONG, "socket path too long: %s", path);
		err_connect_failed();
		return r;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);

	c = calloc(1, sizeof(*c));
	if (!c)
		return err_set(-ENOMEM, "out of memory");
	memcpy(c->path, sa.sun_path, sizeof(c->path));
	c->sock = -1;
	c->wake_fd = -1;
	c->next_seq = 1;
	c->pid = getpid();
	c->conn_gen = 1; /* 0 means "names no lease" to may_send_locked */
	pthread_rwlock_init(&c->sock_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	lease_install_hooks(c);
	c->cache_limit_bytes = cache_limit_from_env();
	c->cache_slack_pct = 100;
	c->cache_idle_ms = cache_idle_ms_from_env();
	c->rxbuf = malloc(PB_MAX_MSG_BYTES);
	if (!c->rxbuf) {
		r = err_set(-ENOMEM, "out of memory");
		goto fail;
	}
	/* The receiver waits on it as well as the socket: a lease cached into an empty cache starts its tick. */
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake_fd < 0) {
		r = err_set(-errno, "eventfd: %m");
		goto fail;
	}
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0) {
		r = err_set(-errno, "socket: %m");
		goto fail;
	}
	if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = err_set(-errno, "no broker at %s: %m", path);
		goto fail;
	}
	r = receiver_hello(c, path, &c->instance_id);
	if (r < 0)
		goto fail;
	r = receiver_start(c);
	if (r < 0)
		goto fail;
	err_connect_succeeded();
	*ret = c;
	return 0;

fail:
	err_connect_failed();
	client_free(c);
	return r;
}

void pb_disconnect(pb_client *c)
{
	if (!c)
		return;
	staging_client_close(c);
	lease_release_all(c);
	receiver_stop(c);
	staging_client_free(c);
	client_free(c);
}
