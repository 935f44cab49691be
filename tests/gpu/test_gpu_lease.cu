/* SPDX-License-Identifier: MIT */
/* GPU test: broker leases taken by several processes are CUDA-registered, copy asynchronously, keep data, and unregister on release and revoke. */
#include <ctype.h>
#include <getopt.h>
#include <spawn.h>
#include <stdbool.h>
#include <sys/resource.h>

#include "gpu_util.h"

extern char **environ;

#define MAX_PROCS 32
#define MAX_SIZES 8
/* Hang guards only (a check that never finishes fails); nothing here asserts speed. */
#define HANG_GUARD_MS 30000u
#define SPIN_CAP_NS 20000000000ull /* the spin kernel gives up after 20 s if the host never stops it */

struct opts {
	const char *socket;
	const char *daemon;
	const char *pinctl;
	const char *daemon_args[16];
	int n_daemon_args;
	int procs;
	int expect_hugetlb; /* -1 any, 0 no, 1 yes */
	bool cpu_smoke;
	size_t sizes[MAX_SIZES];
	int n_sizes;
};

/* Shared with the workers (MAP_SHARED): every lease id they saw, to check they are distinct. */
struct shared {
	uint64_t ids[MAX_PROCS][MAX_SIZES + 4];
	int checks[MAX_PROCS];
	int failures[MAX_PROCS];
};

static int worker_idx;
static int n_checks, n_failures;
static bool have_gpu;

__attribute__((format(printf, 2, 3))) static bool check(bool ok, const char *fmt, ...)
{
	va_list ap;

	n_checks++;
	if (!ok)
		n_failures++;
	printf("[w%d] %s: ", worker_idx, ok ? "ok" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	return ok;
}

/* ---------------------------------------------------------------- CUDA checks */

static __device__ unsigned long long global_ns(void)
{
	unsigned long long t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/*
 * Runs until the host sets flags[0] (or SPIN_CAP_NS passes). flags[1] says it
 * started; flags[2] is 1 when the host stopped it, 2 when it hit the cap.
 */
static __global__ void spin_until_stopped(volatile int *flags, unsigned long long cap_ns)
{
	unsigned long long t0 = global_ns();

	flags[1] = 1;
	__threadfence_system();
	while (!flags[0]) {
		if (global_ns() - t0 > cap_ns) {
			flags[2] = 2;
			return;
		}
	}
	flags[2] = 1;
}

/* The driver must know the whole range as registered host memory with a device mapping. */
static void check_registered(const char *what, void *p, size_t bytes)
{
	const size_t offs[3] = { 0, bytes / 2, bytes - 1 };
	bool all_ok = true;
	unsigned int flags = 0;
	void *dptr = NULL;

	cudaError_t e;

	/* Soft checks: a failure is reported and cleared, so the checks after it still run. */
	for (int i = 0; i < 3; i++) {
		struct cudaPointerAttributes a;
		char *q = (char *)p + offs[i];

		memset(&a, 0, sizeof(a));
		e = cudaPointerGetAttributes(&a, q);
		if (e != cudaSuccess || a.type != cudaMemoryTypeHost || a.devicePointer == NULL) {
			check(false, "%s: cudaPointerGetAttributes(base+%zu): %s, type %d, devicePointer %p", what,
			      offs[i], cudaGetErrorString(e), (int)a.type, a.devicePointer);
			(void)cudaGetLastError();
			all_ok = false;
		}
	}
	e = cudaHostGetDevicePointer(&dptr, p, 0);
	if (e != cudaSuccess) {
		check(false, "%s: cudaHostGetDevicePointer: %s", what, cudaGetErrorString(e));
		(void)cudaGetLastError();
		all_ok = false;
	}
	e = cudaHostGetFlags(&flags, p);
	if (e != cudaSuccess) {
		/* Informational: the flags query is documented for cudaHostAlloc memory. */
		printf("[w%d] note: %s: cudaHostGetFlags: %s\n", worker_idx, what, cudaGetErrorString(e));
		(void)cudaGetLastError();
	}
	check(all_ok && dptr != NULL,
	      "%s: registered host memory over the whole range (cudaMemoryTypeHost, devicePointer %p, flags 0x%x)",
	      what, dptr, flags);
}

/* After release or revoke: the driver must have forgotten the range, and no error may linger. */
static void check_unregistered(const char *what, void *p)
{
	struct cudaPointerAttributes a;
	cudaError_t e;

	memset(&a, 0, sizeof(a));
	e = cudaPointerGetAttributes(&a, p);
	check(e == cudaSuccess && a.type == cudaMemoryTypeUnregistered,
	      "%s: old address no longer registered (cudaPointerGetAttributes: %s, type %d)", what,
	      cudaGetErrorString(e), (int)a.type);
	e = cudaGetLastError();
	check(e == cudaSuccess, "%s: no CUDA error left behind (cudaGetLastError: %s)", what, cudaGetErrorString(e));
}

/*
 * Random contents survive host -> device -> host through the lease. A lease registered in pieces
 * (pb_lease_cuda_piece_bytes) is copied as the library tells callers to: one copy per piece, split at the
 * boundaries.
 */
static void check_roundtrip(const char *what, void *p, size_t bytes, size_t piece, uint64_t seed)
{
	size_t step = piece ? piece : bytes;
	cudaStream_t s;
	void *dev;
	size_t bad;

	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaMalloc(&dev, bytes));
	fill_random(p, bytes, seed);
	for (size_t off = 0; off < bytes; off += step)
		CK(cudaMemcpyAsync((char *)dev + off, (char *)p + off, bytes - off < step ? bytes - off : step,
				   cudaMemcpyHostToDevice, s));
	CK(cudaStreamSynchronize(s));
	memset(p, 0x5a, bytes);
	for (size_t off = 0; off < bytes; off += step)
		CK(cudaMemcpyAsync((char *)p + off, (char *)dev + off, bytes - off < step ? bytes - off : step,
				   cudaMemcpyDeviceToHost, s));
	CK(cudaStreamSynchronize(s));
	bad = check_random(p, bytes, seed);
	check(bad == (size_t)-1, "%s: random data survives H2D then D2H (%zu bytes%s%zu)", what, bytes,
	      bad == (size_t)-1 ? "" : ", first difference at ", bad == (size_t)-1 ? (size_t)0 : bad);
	CK(cudaFree(dev));
	CK(cudaStreamDestroy(s));
}

/*
 * What one copy that crosses a piece boundary does with this driver: reported, not asserted (docs/library.md
 * tells callers to split such copies). 2 MiB on each side of the first boundary, each way, and its speed
 * against the same copy inside one piece.
 */
static void note_copy_across_pieces(const char *what, void *p, size_t piece)
{
	const size_t n = 4u << 20;
	char *h = (char *)p + piece - n / 2;
	cudaStream_t s;
	void *dev;

	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaMalloc(&dev, n));
	for (int dir = 0; dir < 2; dir++) {
		char *src[2] = { (char *)p, h };
		double gbs[2] = { 0, 0 };
		cudaError_t e[2];

		for (int i = 0; i < 2; i++) {
			uint64_t t0;

			/* Once to warm up, once timed. */
			for (int rep = 0; rep < 2; rep++) {
				t0 = now_ns();
				e[i] = dir == 0 ? cudaMemcpyAsync(dev, src[i], n, cudaMemcpyHostToDevice, s)
						: cudaMemcpyAsync(src[i], dev, n, cudaMemcpyDeviceToHost, s);
				if (e[i] == cudaSuccess)
					e[i] = cudaStreamSynchronize(s);
				(void)cudaGetLastError();
			}
			gbs[i] = (double)n / (double)(now_ns() - t0);
		}
		printf("[w%d] note: %s: one %s copy of %zu bytes across the piece boundary at %zu: %s, %.1f GB/s "
		       "(inside one piece: %s, %.1f GB/s)\n",
		       worker_idx, what, dir == 0 ? "H2D" : "D2H", n, piece, cudaGetErrorString(e[1]), gbs[1],
		       cudaGetErrorString(e[0]), gbs[0]);
	}
	CK(cudaFree(dev));
	CK(cudaStreamDestroy(s));
}

/*
 * An H2D copy from the lease completes while a kernel on another stream is
 * still running. The kernel runs until the host stops it, and the host stops it
 * only after the copy has finished: a copy serialised behind the kernel would
 * leave the kernel to hit its cap, which fails the check. No timing is asserted.
 */
static void check_overlap(const char *what, void *p, size_t bytes)
{
	cudaStream_t s_kernel, s_copy;
	cudaEvent_t k0, k1, c0, c1;
	volatile int *flags;
	int *dflags;
	void *dev;
	cudaError_t q;
	uint64_t t0;
	float k_ms = 0, c_ms = 0;
	bool started = true;

	CK(cudaHostAlloc((void **)&flags, 64, cudaHostAllocMapped));
	flags[0] = flags[1] = flags[2] = 0;
	CK(cudaHostGetDevicePointer((void **)&dflags, (void *)flags, 0));
	CK(cudaMalloc(&dev, bytes));
	CK(cudaStreamCreateWithFlags(&s_kernel, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s_copy, cudaStreamNonBlocking));
	CK(cudaEventCreate(&k0));
	CK(cudaEventCreate(&k1));
	CK(cudaEventCreate(&c0));
	CK(cudaEventCreate(&c1));

	CK(cudaEventRecord(k0, s_kernel));
	spin_until_stopped<<<1, 1, 0, s_kernel>>>(dflags, SPIN_CAP_NS);
	CK_LAUNCH();
	CK(cudaEventRecord(k1, s_kernel));
	t0 = now_ns();
	while (!flags[1]) {
		if (ms_since(t0) > HANG_GUARD_MS) {
			started = false;
			break;
		}
	}
	check(started, "%s: spin kernel started", what);

	CK(cudaEventRecord(c0, s_copy));
	CK(cudaMemcpyAsync(dev, p, bytes, cudaMemcpyHostToDevice, s_copy));
	CK(cudaEventRecord(c1, s_copy));
	CK(cudaEventSynchronize(c1));
	q = cudaEventQuery(k1);
	if (q == cudaErrorNotReady)
		(void)cudaGetLastError(); /* "not ready" is an answer, not an error to carry */
	flags[0] = 1;
	CK(cudaStreamSynchronize(s_kernel));
	CK(cudaEventElapsedTime(&k_ms, k0, k1));
	CK(cudaEventElapsedTime(&c_ms, c0, c1));
	check(q == cudaErrorNotReady && flags[2] == 1,
	      "%s: H2D copy of %zu bytes finished while the kernel ran (copy %.2f ms inside kernel %.2f ms; %s)", what,
	      bytes, c_ms, k_ms, q == cudaErrorNotReady ? "kernel still running" : "kernel had already ended");

	CK(cudaEventDestroy(k0));
	CK(cudaEventDestroy(k1));
	CK(cudaEventDestroy(c0));
	CK(cudaEventDestroy(c1));
	CK(cudaStreamDestroy(s_kernel));
	CK(cudaStreamDestroy(s_copy));
	CK(cudaFree(dev));
	CK(cudaFreeHost((void *)flags));
}

/* ---------------------------------------------------------------- broker checks */

static bool daemon_lists_lease(pb_client *c, uint64_t id)
{
	struct pb_status *st = NULL;
	bool found = false;
	int r = pb_status_get(c, &st);

	if (r < 0) {
		check(false, "pb_status_get: %s", pb_last_error());
		return true;
	}
	for (size_t i = 0; i < st->n_leases; i++)
		if (st->leases[i].id == id)
			found = true;
	pb_status_free(st);
	return found;
}

/*
 * Registered in one call up to the piece size ($PINBROKER_CUDA_REGISTER_PIECE in bytes when the run sets it,
 * else 256 GiB), in pieces no bigger above it.
 */
static void check_pieces(const char *what, pb_lease *l)
{
	const char *env = getenv("PINBROKER_CUDA_REGISTER_PIECE");
	size_t max = env && *env ? (size_t)strtoull(env, NULL, 10) : (size_t)256 << 30;
	size_t sz = pb_lease_size(l), piece = pb_lease_cuda_piece_bytes(l);

	if (sz <= max)
		check(piece == 0, "%s: %zu bytes registered in one call (piece size %zu): piece bytes %zu", what, sz,
		      max, piece);
	else
		check(piece > 0 && piece <= max && piece % pb_lease_page_size(l) == 0,
		      "%s: %zu bytes registered in pieces of %zu (at most %zu)", what, sz, piece, max);
}

/* Host-side checks that hold with or without a GPU. */
static void check_lease_basics(const struct opts *o, pb_lease *l, size_t asked)
{
	size_t sz = pb_lease_size(l), pg = pb_lease_page_size(l);
	enum pb_memory_kind kind = pb_lease_kind(l);
	enum pb_memory_kind want = have_gpu ? PB_MEM_PINNED : PB_MEM_LOCKED;

	check(kind == want, "lease %llu (%zu bytes): kind %d, want %d (%s)", (unsigned long long)pb_lease_id(l), asked,
	      (int)kind, (int)want, want == PB_MEM_PINNED ? "pinned and CUDA-registered" : "locked, no CUDA here");
	check(pb_lease_cuda_registered(l) == (have_gpu ? 1 : 0), "lease %llu: pb_lease_cuda_registered() = %d",
	      (unsigned long long)pb_lease_id(l), pb_lease_cuda_registered(l));
	check(pg && sz >= asked && sz % pg == 0 && sz - asked < pg,
	      "lease %llu: size %zu = %zu rounded up to its page size %zu", (unsigned long long)pb_lease_id(l), sz,
	      asked, pg);
	if (o->expect_hugetlb >= 0)
		check(pb_lease_hugetlb(l) == o->expect_hugetlb, "lease %llu: hugetlb = %d, expected %d",
		      (unsigned long long)pb_lease_id(l), pb_lease_hugetlb(l), o->expect_hugetlb);
	/*
	 * NUMA: with a current CUDA device, a default acquire goes on that GPU's node, as the driver reports it
	 * (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, asked here through the runtime's cudaDevAttrHostNumaId, the same
	 * attribute), else as sysfs numa_node says (read here by the test itself). Where neither names a node the
	 * lease may be anywhere, but on a node and not misplaced on a one-node host.
	 */
	if (have_gpu) {
		char bus[32], path[128], line[32];
		int dev = 0, misplaced = -1, driver_node = -1, sysfs_node = -1, want, lib;

		if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) == cudaSuccess) {
			int node = pb_lease_numa_node(l, &misplaced);
			FILE *f;

			if (cudaDeviceGetAttribute(&driver_node, cudaDevAttrHostNumaId, dev) != cudaSuccess)
				driver_node = -1;
			for (char *c = bus; *c; c++)
				*c = (char)tolower((unsigned char)*c);
			snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
			f = fopen(path, "re");
			if (f) {
				if (fgets(line, sizeof(line), f))
					sysfs_node = atoi(line);
				fclose(f);
			}
			want = driver_node >= 0 ? driver_node : sysfs_node >= 0 ? sysfs_node : -1;
			lib = pb_gpu_numa_node(bus);
			check(lib == want, "pb_gpu_numa_node(%s) = %d; the driver says %d, sysfs %d", bus, lib,
			      driver_node, sysfs_node);
			check(node >= 0 && (want < 0 || node == want) && misplaced == 0,
			      "lease %llu: on NUMA node %d (misplaced %d); the current GPU %s is on node %d "
			      "(driver %d, sysfs %d)",
			      (unsigned long long)pb_lease_id(l), node, misplaced, bus, want, driver_node, sysfs_node);
		}
	}
}

static int run_pinctl_revoke(const struct opts *o, pb_client *c, uint64_t id)
{
	char idbuf[32];
	pid_t pid;
	int status, r;

	snprintf(idbuf, sizeof(idbuf), "%llu", (unsigned long long)id);
	if (!o->pinctl) {
		r = pb_admin_revoke(c, PB_REVOKE_LEASE, id, 0, 0, NULL, NULL);
		check(r == 0, "pb_admin_revoke(%s) (no pinctl given): %s", idbuf, r ? pb_last_error() : "sent");
		return r;
	}
	{
		char *argv[] = { (char *)o->pinctl, (char *)"revoke", idbuf, NULL };

		r = posix_spawn(&pid, o->pinctl, NULL, NULL, argv, environ);
	}
	if (r != 0) {
		check(false, "spawn %s: %s", o->pinctl, strerror(r));
		return -r;
	}
	if (waitpid(pid, &status, 0) < 0)
		return -errno;
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "pinctl revoke %s exited %d", idbuf,
	      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

struct revoke_seen {
	pb_lease *lease;
	uint32_t deadline_ms;
	int calls;
};

static int on_revoke(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *userdata)
{
	struct revoke_seen *rs = (struct revoke_seen *)userdata;

	rs->deadline_ms = deadline_ms;
	__atomic_store_n(&rs->lease, l, __ATOMIC_RELEASE);
	__atomic_add_fetch(&rs->calls, 1, __ATOMIC_SEQ_CST);
	return 0;
}

/* Revoke with a callback: the application hears of it and releases; the range is then unregistered. */
static void check_revoke_callback(const struct opts *o, pb_client *c, size_t bytes, uint64_t *id_out)
{
	struct pb_acquire_opts ao = { 0, 0, PB_PRIORITY_NORMAL, "gpu-test-revoke-cb", 0, NULL };
	struct revoke_seen rs = { NULL, 0, 0 };
	pb_lease *l = NULL, *got = NULL;
	uint64_t t0, id;
	void *p;
	int r;

	pb_set_revoke_callback(c, on_revoke, &rs);
	r = pb_acquire(c, bytes, &ao, &l);
	if (!check(r == 0, "revoke/callback: acquire %zu bytes: %s", bytes, r ? pb_last_error() : "granted"))
		return;
	id = *id_out = pb_lease_id(l);
	p = pb_lease_data(l);
	if (have_gpu)
		check_registered("revoke/callback before", p, pb_lease_size(l));
	if (run_pinctl_revoke(o, c, id) < 0)
		return;
	t0 = now_ns();
	while (!(got = __atomic_load_n(&rs.lease, __ATOMIC_ACQUIRE)) && ms_since(t0) < HANG_GUARD_MS)
		sleep_ms(1);
	check(got == l, "revoke/callback: callback called for lease %llu (deadline %u ms)", (unsigned long long)id,
	      rs.deadline_ms);
	if (got != l)
		return;
	r = pb_release(c, l);
	check(r == 0, "revoke/callback: pb_release after the callback: %s", r ? pb_last_error() : "0");
	if (have_gpu)
		check_unregistered("revoke/callback", p);
	check(!daemon_lists_lease(c, id), "revoke/callback: daemon no longer lists lease %llu", (unsigned long long)id);
	check(rs.calls == 1, "revoke/callback: callback ran once (%d)", rs.calls);
	pb_set_revoke_callback(c, NULL, NULL);
}

/* Revoke of an idle lease with no callback: the library gives it back by itself, unregistering it. */
static void check_revoke_idle(const struct opts *o, pb_client *c, size_t bytes, uint64_t *id_out)
{
	struct pb_acquire_opts ao = { 0, 0, PB_PRIORITY_NORMAL, "gpu-test-revoke-idle", 0, NULL };
	pb_lease *l = NULL;
	uint64_t t0, id;
	bool listed = true;
	void *p;
	int r;

	r = pb_acquire(c, bytes, &ao, &l);
	if (!check(r == 0, "revoke/idle: acquire %zu bytes: %s", bytes, r ? pb_last_error() : "granted"))
		return;
	id = *id_out = pb_lease_id(l);
	p = pb_lease_data(l);
	pb_lease_set_idle(l, 1);
	if (run_pinctl_revoke(o, c, id) < 0)
		return;
	t0 = now_ns();
	while ((listed = daemon_lists_lease(c, id)) && ms_since(t0) < HANG_GUARD_MS)
		sleep_ms(2);
	check(!listed, "revoke/idle: the library gave lease %llu back by itself", (unsigned long long)id);
	if (have_gpu && !listed)
		check_unregistered("revoke/idle", p);
	r = pb_release(c, l);
	check(r == 0, "revoke/idle: pb_release of the revoked lease: %s", r ? pb_last_error() : "0");
}

static int worker(const struct opts *o, int idx, struct shared *sh)
{
	pb_client *c = NULL;
	pb_lease *leases[MAX_SIZES] = { 0 };
	void *ptrs[MAX_SIZES] = { 0 };
	int r, nid = 0;

	worker_idx = idx;
	/* Even workers start the CUDA runtime before the library registers, odd ones after. */
	if (have_gpu && idx % 2 == 0) {
		CK(cudaSetDevice(0));
		CK(cudaFree(0));
	}
	r = connect_retry(o->socket, HANG_GUARD_MS, &c);
	if (!check(r == 0, "pb_connect(%s): %s", o->socket, r ? pb_last_error() : "connected"))
		goto out;
	pb_set_cache_limit(c, 0); /* release must really release here; the cache is the benchmark's business */

	for (int i = 0; i < o->n_sizes; i++) {
		char label[48];
		struct pb_acquire_opts ao = { 0, 0, PB_PRIORITY_NORMAL, label, 0, NULL };

		snprintf(label, sizeof(label), "gpu-test-w%d-%d", idx, i);
		r = pb_acquire(c, o->sizes[i], &ao, &leases[i]);
		if (!check(r == 0, "acquire %zu bytes: %s", o->sizes[i], r ? pb_last_error() : "granted"))
			goto out;
		ptrs[i] = pb_lease_data(leases[i]);
		sh->ids[idx][nid++] = pb_lease_id(leases[i]);
		check_lease_basics(o, leases[i], o->sizes[i]);
	}
	if (have_gpu && idx % 2 == 1) {
		CK(cudaSetDevice(0));
		CK(cudaFree(0));
	}

	for (int i = 0; i < o->n_sizes; i++) {
		char what[64];
		size_t sz = pb_lease_size(leases[i]);

		snprintf(what, sizeof(what), "lease %llu", (unsigned long long)pb_lease_id(leases[i]));
		if (have_gpu) {
			size_t piece = pb_lease_cuda_piece_bytes(leases[i]);

			check_pieces(what, leases[i]);
			check_registered(what, ptrs[i], sz);
			check_roundtrip(what, ptrs[i], sz, piece, ((uint64_t)getpid() << 20) ^ (uint64_t)i);
			if (piece && sz >= piece + (2u << 20))
				note_copy_across_pieces(what, ptrs[i], piece);
			if (sz >= (16u << 20))
				check_overlap(what, ptrs[i], piece && piece < sz ? piece : sz);
		} else {
			/* Without a GPU the memory must still be ours, whole and writable. */
			fill_random(ptrs[i], sz, (uint64_t)i);
			check(check_random(ptrs[i], sz, (uint64_t)i) == (size_t)-1,
			      "%s: contents written and read back", what);
		}
	}

	for (int i = 0; i < o->n_sizes; i++) {
		char what[64];
		uint64_t id = pb_lease_id(leases[i]);

		snprintf(what, sizeof(what), "release %llu", (unsigned long long)id);
		r = pb_release(c, leases[i]);
		leases[i] = NULL;
		check(r == 0, "%s: pb_release: %s", what, r ? pb_last_error() : "0");
		if (have_gpu)
			check_unregistered(what, ptrs[i]);
		check(!daemon_lists_lease(c, id), "%s: daemon no longer lists it", what);
	}

	check_revoke_callback(o, c, 64u << 20, &sh->ids[idx][nid++]);
	check_revoke_idle(o, c, 64u << 20, &sh->ids[idx][nid++]);
out:
	for (int i = 0; i < o->n_sizes; i++)
		if (leases[i])
			pb_release(c, leases[i]);
	pb_disconnect(c);
	sh->checks[idx] = n_checks;
	sh->failures[idx] = n_failures;
	return n_failures || n_checks == 0 ? 1 : 0;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f, "usage: test_gpu_lease (--socket PATH | --daemon PINBROKERD [--daemon-arg ARG]...)\n"
		   "         [--pinctl PINCTL] [--procs N] [--sizes 2M,64M,...] [--expect-hugetlb 0|1]\n"
		   "         [--cpu-smoke]\n"
		   "Exits 0 when every check passed, 1 on a failure, 77 (skip) without a GPU.\n"
		   "--cpu-smoke: without a GPU, still run the broker checks, then exit 77.\n");
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "daemon", required_argument, NULL, 'd' },
		{ "daemon-arg", required_argument, NULL, 'a' },
		{ "pinctl", required_argument, NULL, 'p' },
		{ "procs", required_argument, NULL, 'n' },
		{ "sizes", required_argument, NULL, 'z' },
		{ "expect-hugetlb", required_argument, NULL, 'H' },
		{ "cpu-smoke", no_argument, NULL, 'C' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	o->procs = 4;
	o->expect_hugetlb = -1;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 's':
			o->socket = optarg;
			break;
		case 'd':
			o->daemon = optarg;
			break;
		case 'a':
			if (o->n_daemon_args >= 15)
				return -1;
			o->daemon_args[o->n_daemon_args++] = optarg;
			break;
		case 'p':
			o->pinctl = optarg[0] ? optarg : NULL;
			break;
		case 'n':
			o->procs = atoi(optarg);
			break;
		case 'H':
			o->expect_hugetlb = atoi(optarg);
			break;
		case 'C':
			o->cpu_smoke = true;
			break;
		case 'z': {
			char *dup = strdup(optarg), *save = NULL;

			o->n_sizes = 0;
			for (char *t = strtok_r(dup, ",", &save); t && o->n_sizes < MAX_SIZES;
			     t = strtok_r(NULL, ",", &save))
				if ((o->sizes[o->n_sizes++] = parse_size(t)) == 0)
					return -1;
			free(dup);
			break;
		}
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return -1;
		}
	}
	if (o->procs < 1 || o->procs > MAX_PROCS || (!o->socket && !o->daemon))
		return -1;
	if (o->n_sizes == 0) {
		/* A small one, an odd size that is rounded up, and one made of many chunks. */
		o->sizes[0] = 2u << 20;
		o->sizes[1] = (64u << 20) + 12345;
		o->sizes[2] = 256u << 20;
		o->n_sizes = 3;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct shared *sh;
	char gpu[256], sock_path[108] = "", log_path[128] = "";
	pid_t daemon_pid = -1, pids[MAX_PROCS];
	int total_checks = 0, total_failures = 0, bad_exits = 0, dup_ids = 0;

	memset(&o, 0, sizeof(o));
	if (parse_opts(argc, argv, &o) < 0) {
		usage(stderr);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	have_gpu = gpu_probe(gpu, sizeof(gpu));
	if (!have_gpu && !o.cpu_smoke) {
		printf("SKIP: %s; the GPU tests run only on a GPU host (tests/gpu/run-gpu.sh)\n", gpu);
		return GPU_EXIT_SKIP;
	}
	printf("GPU: %s\n", have_gpu ? gpu : "none");

	if (!o.socket) {
		/* No daemon given: start our own on a temp socket. */
		const char *argv_d[40];
		int n = 0;
		bool root = geteuid() == 0;
		struct rlimit rl;

		snprintf(sock_path, sizeof(sock_path), "/tmp/pb-gputest-%d.sock", (int)getpid());
		snprintf(log_path, sizeof(log_path), "/tmp/pb-gputest-%d.log", (int)getpid());
		getrlimit(RLIMIT_MEMLOCK, &rl);
		argv_d[n++] = o.daemon;
		argv_d[n++] = "--socket";
		argv_d[n++] = sock_path;
		argv_d[n++] = "--budget";
		argv_d[n++] = "4G";
		argv_d[n++] = "--prewarm";
		argv_d[n++] = "1G";
		argv_d[n++] = "--lock-memory";
		argv_d[n++] = root || rl.rlim_cur == RLIM_INFINITY ? "yes" : "no";
		for (int i = 0; i < o.n_daemon_args; i++)
			argv_d[n++] = o.daemon_args[i];
		argv_d[n] = NULL;
		daemon_pid = spawn_daemon((char *const *)argv_d, log_path);
		if (daemon_pid < 0) {
			printf("FAIL: cannot start %s\n", o.daemon);
			return 1;
		}
		o.socket = sock_path;
		printf("started %s on %s (log %s)\n", o.daemon, sock_path, log_path);
	}
	setenv("PINBROKER_SOCKET", o.socket, 1); /* for pinctl */

	sh = (struct shared *)mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(sh, 0, sizeof(*sh));
	for (int i = 0; i < o.procs; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			perror("fork");
			return 1;
		}
		if (pids[i] == 0)
			_exit(worker(&o, i, sh));
	}
	for (int i = 0; i < o.procs; i++) {
		int status = 0;

		waitpid(pids[i], &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			printf("worker %d (pid %d) %s %d\n", i, (int)pids[i],
			       WIFEXITED(status) ? "exited" : "killed by signal",
			       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			bad_exits++;
		}
		total_checks += sh->checks[i];
		total_failures += sh->failures[i];
	}
	/* Every lease id handed out, across all processes, must be distinct. */
	for (int a = 0; a < o.procs; a++)
		for (int i = 0; i < MAX_SIZES + 4; i++)
			for (int b = 0; b < o.procs && sh->ids[a][i]; b++)
				for (int j = 0; j < MAX_SIZES + 4; j++)
					if ((a != b || i != j) && sh->ids[a][i] == sh->ids[b][j])
						dup_ids++;
	if (dup_ids)
		printf("FAIL: %d duplicate lease ids across processes\n", dup_ids / 2);

	if (daemon_pid > 0) {
		int st = stop_daemon(daemon_pid, 10000);

		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			printf("FAIL: pinbrokerd did not exit cleanly (status 0x%x); log: %s\n", st, log_path);
			bad_exits++;
		} else {
			unlink(log_path);
		}
	}
	printf("gpu_lease: %d checks, %d failed, in %d processes%s\n", total_checks, total_failures, o.procs,
	       have_gpu ? "" : " (no GPU: CUDA checks skipped)");
	if (total_failures || bad_exits || dup_ids)
		return 1;
	if (!have_gpu) {
		printf("SKIP: %s; broker checks passed, CUDA checks need a GPU\n", gpu);
		return GPU_EXIT_SKIP;
	}
	return 0;
}
