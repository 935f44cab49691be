/* SPDX-License-Identifier: MIT */
/* libpinbroker's errors: pb_last_error's per-thread text, pb_strerror, errnos for the daemon's status codes. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static __thread char last_error[512];
/* The daemon's words for the last refusal in this thread, for fallback reasons. */
static __thread char last_daemon_message[256];

/* Why the last pb_connect failed, process-wide: pb_acquire_or_fallback(NULL, ...) reports it. */
static pthread_mutex_t connect_failure_lock = PTHREAD_MUTEX_INITIALIZER;
static char connect_failure[ERR_CONNECT_FAILURE_LEN];

int err_set(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return err;
}

void err_clear(void)
{
	last_error[0] = '\0';
}

const char *pb_version(void)
{
	return PINBROKER_VERSION; /* project(VERSION), the same for every binary of this build */
}

const char *pb_last_error(void)
{
	return last_error[0] ? last_error : "no error";
}

const char *pb_strerror(int err)
{
	switch (err) {
	case 0:
		return "success";
	case -EDQUOT:
		return "over uid quota";
	case -ENOSPC:
		return "budget exhausted";
	case -EFBIG:
		return "larger than the budget allows";
	case -EBUSY:
		return "host memory is tight";
	case -EAGAIN:
		return "host memory is critical";
	case -EINVAL:
		return "invalid size or argument";
	case -ENOENT:
		return "not found (no such lease, or no broker socket)";
	case -ECONNREFUSED:
		return "broker not running";
	case -EPERM:
		return "not your lease";
	case -EACCES:
		return "permission denied";
	case -ETIMEDOUT:
		return "timed out waiting for memory";
	case -EUSERS:
		return "connection or lease limit reached";
	case -ESHUTDOWN:
		return "broker is shutting down";
	case -EPROTONOSUPPORT:
		return "protocol version mismatch";
	case -EPROTO:
		return "protocol error";
	case -EIO:
		return "broker internal error";
	case -ECONNRESET:
		return "connection to the broker lost";
	case -ENOTCONN:
		return "not connected to a broker";
	case -ENOMEM:
		return "out of memory";
	default:
		return strerror(err < 0 ? -err : err);
	}
}

static int status_to_errno(Pinbroker__V1__StatusCode s)
{
	switch (s) {
	case PINBROKER__V1__STATUS_CODE__STATUS_OK:
		return 0;
	case PINBROKER__V1__STATUS_CODE__STATUS_OVER_QUOTA:
		return -EDQUOT;
	case PINBROKER__V1__STATUS_CODE__STATUS_OVER_BUDGET:
		return -ENOSPC;
	case PINBROKER__V1__STATUS_CODE__STATUS_TOO_LARGE:
		return -EFBIG;
	case PINBROKER__V1__STATUS_CODE__STATUS_PRESSURE:
		return -EBUSY;
	case PINBROKER__V1__STATUS_CODE__STATUS_CRITICAL:
		return -EAGAIN;
	case PINBROKER__V1__STATUS_CODE__STATUS_INVALID_SIZE:
	case PINBROKER__V1__STATUS_CODE__STATUS_INVALID_ARGUMENT:
		return -EINVAL;
	case PINBROKER__V1__STATUS_CODE__STATUS_UNKNOWN_LEASE:
	case PINBROKER__V1__STATUS_CODE__STATUS_SHARE_DENIED:
		return -ENOENT;
	case PINBROKER__V1__STATUS_CODE__STATUS_NOT_YOUR_LEASE:
		return -EPERM;
	case PINBROKER__V1__STATUS_CODE__STATUS_PERMISSION_DENIED:
		return -EACCES;
	case PINBROKER__V1__STATUS_CODE__STATUS_TIMEOUT:
		return -ETIMEDOUT;
	case PINBROKER__V1__STATUS_CODE__STATUS_LIMIT:
		return -EUSERS;
	case PINBROKER__V1__STATUS_CODE__STATUS_SHUTTING_DOWN:
		return -ESHUTDOWN;
	case PINBROKER__V1__STATUS_CODE__STATUS_VERSION_MISMATCH:
		return -EPROTONOSUPPORT;
	case PINBROKER__V1__STATUS_CODE__STATUS_NO_HELLO:
	case PINBROKER__V1__STATUS_CODE__STATUS_BAD_REQUEST:
		return -EPROTO;
	case PINBROKER__V1__STATUS_CODE__STATUS_INTERNAL:
	default:
		return -EIO;
	}
}

int err_reply(const Reply *rep)
{
	int err = status_to_errno(rep->status);
	const char *msg = rep->message && rep->message[0] ? rep->message : pb_strerror(err);

	snprintf(last_daemon_message, sizeof(last_daemon_message), "%s", msg);
	return err_set(err, "%s", msg);
}

const char *err_daemon_message(void)
{
	return last_daemon_message;
}

void err_forget_daemon_message(void)
{
	last_daemon_message[0] = '\0';
}

static void record_connect_failure(const char *msg)
{
	pthread_mutex_lock(&connect_failure_lock);
	snprintf(connect_failure, sizeof(connect_failure), "%s", msg);
	pthread_mutex_unlock(&connect_failure_lock);
}

void err_connect_failed(void)
{
	record_connect_failure(last_error);
}

void err_connect_succeeded(void)
{
	record_connect_failure("");
}

void err_connect_failure(char *buf, size_t len)
{
	pthread_mutex_lock(&connect_failure_lock);
	snprintf(buf, len, "%s", connect_failure[0] ? connect_failure : "not connected to a broker");
	pthread_mutex_unlock(&connect_failure_lock);
}
