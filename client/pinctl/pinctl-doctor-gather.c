/* SPDX-License-Identifier: MIT */
/*
 * pinctl doctor's reading: the host's files (under a fixture root for tests), the daemon and its pid, the CUDA
 * driver; and the findings' record.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "pinbroker.h"
#include "pinctl-doctor.h"
#include "pinctl.h"
#include "util.h"

struct finding *doctor_add(struct doctor *d, const char *name, enum doctor_status st, const char *fmt, ...)
{
	struct finding *f = &d->findings[d->n++];
	va_list ap;

	f->name = name;
	f->status = st;
	va_start(ap, fmt);
	vsnprintf(f->message, sizeof(f->message), fmt, ap);
	va_end(ap);
	f->fix[0] = '\0';
	return f;
}

void doctor_fix(struct finding *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(f->fix, sizeof(f->fix), fmt, ap);
	va_end(ap);
}

/* ---------------------------------------------------------------- reading files */

const char *doctor_rooted(const struct doctor *d, const char *path, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s", d->root, path);
	return buf;
}

ssize_t doctor_read_text(const char *path, char *buf, size_t len)
{
	return read_text_at(AT_FDCWD, path, buf, len);
}

int doctor_field_u64(const char *text, const char *key, int base, uint64_t *ret)
{
	size_t klen = strlen(key);

	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (strncmp(p, key, klen) == 0 && p[klen] == ':') {
			*ret = strtoull(p + klen + 1, NULL, base);
			return 0;
		}
	}
	return -ENOENT;
}

/* meminfo's kB figures in bytes. */
int doctor_meminfo_bytes(const struct doctor *d, const char *key, uint64_t *ret)
{
	char path[PATH_MAX], buf[8192];
	uint64_t kb;

	if (doctor_read_text(doctor_rooted(d, "/proc/meminfo", path, sizeof(path)), buf, sizeof(buf)) < 0)
		return -ENOENT;
	if (doctor_field_u64(buf, key, 10, &kb) < 0)
		return -ENOENT;
	*ret = kb * 1024;
	return 0;
}

/* ---------------------------------------------------------------- gathering */

static bool comm_is_pinbrokerd(pid_t pid)
{
	char path[64], comm[64];

	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	if (doctor_read_text(path, comm, sizeof(comm)) < 0)
		return false;
	comm[strcspn(comm, "\n")] = '\0';
	return strcmp(comm, "pinbrokerd") == 0;
}

/*
 * The daemon's pid: the socket's peer (SO_PEERCRED names whoever called listen()), or, where that
 * is pid 1 (socket activation), the only pinbrokerd in /proc. 0 when there is none: without a
 * listener on this socket no daemon serves it, whatever other pinbrokerd runs (another socket's).
 */
static pid_t find_daemon(const char *socket_path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred;
	socklen_t len = sizeof(cred);
	pid_t found = 0;
	bool activated = false;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	DIR *dir;
	struct dirent *e;

	if (fd >= 0) {
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
		/* The listener is the daemon whatever its comm (under valgrind it is memcheck's). */
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
		    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
			if (cred.pid > 1)
				found = cred.pid;
			activated = cred.pid == 1;
		}
		close(fd);
	}
	if (found || !activated)
		return found;
	dir = opendir("/proc");
	if (!dir)
		return 0;
	while ((e = readdir(dir)) != NULL) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);

		if (*end || pid <= 0 || !comm_is_pinbrokerd((pid_t)pid))
			continue;
		if (found) { /* two daemons: the peer would have told; don't guess */
			found = 0;
			break;
		}
		found = (pid_t)pid;
	}
	closedir(dir);
	return found;
}

typedef int (*cu_int_fn)(int *);
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_dev_get_fn)(int *, int);
typedef int (*cu_total_mem_fn)(size_t *, int);

/* The driver the library would use (client/lib/cuda.c: dlopen libcuda.so.1), its version and its GPUs' memory. */
static void probe_cuda(struct doctor *d)
{
	const char *env = getenv("PINBROKER_NO_CUDA");
	cu_int_fn get_version, get_count;
	cu_init_fn init;
	cu_dev_get_fn dev_get;
	cu_total_mem_fn total_mem;
	void *h;
	int r;

	if (env && *env && strcmp(env, "0") != 0) {
		snprintf(d->cuda_msg, sizeof(d->cuda_msg), "disabled by PINBROKER_NO_CUDA");
		return;
	}
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(d->cuda_msg, sizeof(d->cuda_msg), "libcuda.so.1 not found: no NVIDIA driver on this host");
		return;
	}
	d->cuda_loaded = true;
	*(void **)&get_version = dlsym(h, "cuDriverGetVersion");
	*(void **)&init = dlsym(h, "cuInit");
	*(void **)&get_count = dlsym(h, "cuDeviceGetCount");
	*(void **)&dev_get = dlsym(h, "cuDeviceGet");
	*(void **)&total_mem = dlsym(h, "cuDeviceTotalMem_v2");
	if (!total_mem)
		*(void **)&total_mem = dlsym(h, "cuDeviceTotalMem");
	if (!get_version || get_version(&d->driver_version) != 0)
		d->driver_version = 0;
	if (!init || !get_count || !dev_get) {
		snprintf(d->cuda_msg, sizeof(d->cuda_msg),
			 "libcuda.so.1 lacks cuInit, cuDeviceGetCount or cuDeviceGet");
		return;
	}
	r = init(0);
	if (r != 0) {
		snprintf(d->cuda_msg, sizeof(d->cuda_msg), "cuInit failed with CUDA error %d", r);
		return;
	}
	if (get_count(&d->gpus) != 0 || d->gpus <= 0) {
		snprintf(d->cuda_msg, sizeof(d->cuda_msg), "no CUDA devices");
		d->gpus = 0;
		return;
	}
	d->cuda_usable = true;
	for (int i = 0; i < d->gpus && total_mem; i++) {
		size_t bytes = 0;
		int dev;

		if (dev_get(&dev, i) == 0 && total_mem(&bytes, dev) == 0)
			d->gpu_bytes += bytes;
	}
	/* The handle stays open: closing a CUDA driver after cuInit is not supported. */
}

bool doctor_no_daemon(const struct doctor *d)
{
	switch (d->connect_err) {
	case -ENOENT:
	case -ECONNREFUSED:
	case -ETIMEDOUT:
	case -ECONNRESET:
		return true;
	default:
		return false;
	}
}

void doctor_gather(struct doctor *d)
{
	struct pb_status *s;
	pb_client *c;
	int r;

	d->root = getenv(DOCTOR_ROOT_ENV);
	if (!d->root)
		d->root = "";
	d->socket = pinctl_socket();
	r = pinctl_connect_waiting(d->socket, &c); /* pinctl --wait doctor waits for a daemon just started */
	d->connect_err = r;
	if (r < 0) {
		snprintf(d->connect_msg, sizeof(d->connect_msg), "%s", pb_last_error());
	} else {
		if (pb_status_query(c, 0, &s) == 0) {
			d->have_status = true;
			d->budget_bytes = s->budget_bytes;
			d->chunk_size_bytes = s->chunk_size_bytes;
			d->chunk_max_bytes = s->chunk_max_bytes;
			d->chunk_capacity = s->chunk_capacity;
			snprintf(d->page_kind, sizeof(d->page_kind), "%s", s->page_kind ? s->page_kind : "");
			{
				const char *root, *ns = pb_status_cgroup_namespace(s, &root);

				snprintf(d->cgroup_ns, sizeof(d->cgroup_ns), "%s", ns ? ns : "");
				snprintf(d->cgroup_ns_root, sizeof(d->cgroup_ns_root), "%s", root ? root : "");
			}
			d->job_unknown_clients = pb_status_job_unknown(s, &d->job_unknown_total);
			{
				const char *books, *w = pb_status_restart_warning(s, &books);

				snprintf(d->restart_books, sizeof(d->restart_books), "%s", books ? books : "");
				snprintf(d->restart_warning, sizeof(d->restart_warning), "%s", w ? w : "");
			}
			pb_status_free(s);
		}
		pb_disconnect(c);
	}
	d->daemon_pid = find_daemon(d->socket);
	probe_cuda(d);
}
