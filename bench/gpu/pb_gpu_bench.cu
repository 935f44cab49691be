/* SPDX-License-Identifier: MIT */
/* GPU benchmark: broker leases against pageable memory, cudaHostAlloc and cudaHostRegister, printed as RESULT lines for report.py. */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>

#include <algorithm>
#include <vector>

#include "gpu_util.h"

/* Guards against a sibling that died or a daemon that never answers; no result depends on them. */
#define BARRIER_GUARD_MS 300000u
#define CONNECT_GUARD_MS 120000u

static double median(std::vector<double> v)
{
	if (v.empty())
		return NAN;
	std::sort(v.begin(), v.end());
	return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

static double vmin(const std::vector<double> &v)
{
	return v.empty() ? NAN : *std::min_element(v.begin(), v.end());
}

static double vmax(const std::vector<double> &v)
{
	return v.empty() ? NAN : *std::max_element(v.begin(), v.end());
}

static const char *kind_name(enum pb_memory_kind k)
{
	return k == PB_MEM_PINNED ? "pinned" : k == PB_MEM_LOCKED ? "locked-unregistered" : "fallback-pageable";
}

static std::vector<size_t> parse_sizes(const char *s)
{
	std::vector<size_t> v;
	char *dup = strdup(s), *save = NULL;

	for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		size_t b = parse_size(t);

		if (!b) {
			fprintf(stderr, "not a size: %s\n", t);
			exit(2);
		}
		v.push_back(b);
	}
	free(dup);
	return v;
}

static pb_client *connect_or_die(const char *path)
{
	pb_client *c = NULL;
	int r = connect_retry(path, CONNECT_GUARD_MS, &c);

	if (r < 0) {
		fprintf(stderr, "pb_connect(%s): %s\n", path, pb_last_error());
		exit(1);
	}
	return c;
}

static pb_lease *acquire_or_die(pb_client *c, size_t bytes, uint32_t flags, const char *label)
{
	struct pb_acquire_opts ao = { flags, 0, PB_PRIORITY_NORMAL, label, 0, NULL };
	pb_lease *l = NULL;
	int r = pb_acquire(c, bytes, &ao, &l);

	if (r < 0) {
		fprintf(stderr, "pb_acquire(%zu): %s\n", bytes, pb_last_error());
		exit(1);
	}
	return l;
}

static void init_cuda_on(int dev, double *ctx_ms)
{
	uint64_t t0 = now_ns();

	CK(cudaSetDevice(dev));
	CK(cudaFree(0));
	if (ctx_ms)
		*ctx_ms = ms_since(t0);
}

static void init_cuda(double *ctx_ms)
{
	init_cuda_on(0, ctx_ms);
}

/* ---------------------------------------------------------------- bandwidth */

struct bw_opts {
	int reps;
	int warmup;
};

/* Median, min and max GB/s (1e9 bytes/s, as the anchors) of reps copies timed with events. */
static void time_copies(void *dst, const void *src, size_t bytes, cudaMemcpyKind dir, const struct bw_opts *o,
			cudaStream_t s, double *med, double *lo, double *hi)
{
	cudaEvent_t e0, e1;
	std::vector<double> gbs;

	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int i = 0; i < o->warmup; i++)
		CK(cudaMemcpyAsync(dst, src, bytes, dir, s));
	CK(cudaStreamSynchronize(s));
	for (int i = 0; i < o->reps; i++) {
		float ms = 0;

		CK(cudaEventRecord(e0, s));
		CK(cudaMemcpyAsync(dst, src, bytes, dir, s));
		CK(cudaEventRecord(e1, s));
		CK(cudaEventSynchronize(e1));
		CK(cudaEventElapsedTime(&ms, e0, e1));
		gbs.push_back((double)bytes / 1e9 / (ms / 1e3));
	}
	*med = median(gbs);
	*lo = vmin(gbs);
	*hi = vmax(gbs);
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
}

static void bw_one(const char *source, const char *kind, void *host, size_t bytes, void *dev, const struct bw_opts *o,
		   cudaStream_t s)
{
	double h_med, h_lo, h_hi, d_med, d_lo, d_hi;
	char sz[32];

	time_copies(dev, host, bytes, cudaMemcpyHostToDevice, o, s, &h_med, &h_lo, &h_hi);
	time_copies(host, dev, bytes, cudaMemcpyDeviceToHost, o, s, &d_med, &d_lo, &d_hi);
	printf("RESULT bandwidth source=%s size=%s bytes=%zu kind=%s reps=%d h2d_gbs=%.2f h2d_min=%.2f h2d_max=%.2f "
	       "d2h_gbs=%.2f d2h_min=%.2f d2h_max=%.2f\n",
	       source, size_label(bytes, sz, sizeof(sz)), bytes, kind, o->reps, h_med, h_lo, h_hi, d_med, d_lo, d_hi);
	fflush(stdout);
}

static void bw_broker(const char *source, const char *sock, size_t bytes, void *dev, const struct bw_opts *o,
		      cudaStream_t s)
{
	pb_client *c = connect_or_die(sock);
	pb_lease *l = acquire_or_die(c, bytes, PB_ACQUIRE_NO_CACHE, "bench-bandwidth");

	bw_one(source, kind_name(pb_lease_kind(l)), pb_lease_data(l), bytes, dev, o, s);
	if (pb_release(c, l) < 0)
		fprintf(stderr, "pb_release: %s\n", pb_last_error());
	pb_disconnect(c);
}

static int cmd_bandwidth(const char *sock, const char *sock_huge, const char *sock_thp,
			 const std::vector<size_t> &sizes, const struct bw_opts *o)
{
	cudaStream_t s;

	init_cuda(NULL);
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	for (size_t bytes : sizes) {
		void *dev, *pageable, *pinned;

		CK(cudaMalloc(&dev, bytes));
		CK(cudaMemset(dev, 1, bytes));

		pageable = malloc(bytes);
		if (!pageable) {
			fprintf(stderr, "malloc(%zu) failed\n", bytes);
			return 1;
		}
		memset(pageable, 2, bytes); /* faulted in, as a job's data would be */
		bw_one("pageable", "pageable", pageable, bytes, dev, o, s);
		free(pageable);

		CK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
		memset(pinned, 3, bytes);
		bw_one("cudaHostAlloc", "pinned", pinned, bytes, dev, o, s);
		CK(cudaFreeHost(pinned));

		if (sock)
			bw_broker("broker-4k", sock, bytes, dev, o, s);
		if (sock_huge)
			bw_broker("broker-hugetlb", sock_huge, bytes, dev, o, s);
		if (sock_thp)
			bw_broker("broker-thp", sock_thp, bytes, dev, o, s);
		CK(cudaFree(dev));
	}
	CK(cudaStreamDestroy(s));
	return 0;
}

/* ---------------------------------------------------------------- setup time */

static void setup_result(const char *method, size_t bytes, const std::vector<double> &ms,
			 const std::vector<double> &free_ms, const char *extra)
{
	char sz[32];

	printf("RESULT setup method=%s size=%s bytes=%zu n=%zu first_ms=%.4f median_ms=%.4f min_ms=%.4f max_ms=%.4f "
	       "free_median_ms=%.4f%s%s\n",
	       method, size_label(bytes, sz, sizeof(sz)), bytes, ms.size(), ms.empty() ? NAN : ms[0], median(ms),
	       vmin(ms), vmax(ms), median(free_ms), extra ? " " : "", extra ? extra : "");
	fflush(stdout);
}

/* flags: PB_ACQUIRE_NO_CUDA times the map alone, which splits the cost into map and registration. */
static void setup_broker_warm(const char *method, pb_client *c, size_t bytes, int reps, uint32_t flags)
{
	std::vector<double> ms, free_ms;
	int pinned = 0;
	char extra[64];

	pb_set_cache_limit(c, 0);
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();
		pb_lease *l = acquire_or_die(c, bytes, PB_ACQUIRE_NO_CACHE | flags, "bench-setup");

		ms.push_back(ms_since(t0));
		pinned += pb_lease_kind(l) == PB_MEM_PINNED;
		t0 = now_ns();
		if (pb_release(c, l) < 0)
			fprintf(stderr, "pb_release: %s\n", pb_last_error());
		free_ms.push_back(ms_since(t0));
	}
	snprintf(extra, sizeof(extra), "pinned=%d/%d", pinned, reps);
	setup_result(method, bytes, ms, free_ms, extra);
}

/*
 * Re-acquire from the client cache: prime it with one acquire + release, then
 * time acquires that should be cache hits (same lease id and address back).
 */
static void setup_broker_cached(const char *method, pb_client *c, size_t bytes, int reps)
{
	std::vector<double> ms, free_ms;
	pb_lease *l = acquire_or_die(c, bytes, 0, "bench-cached");
	uint64_t id = pb_lease_id(l);
	void *p = pb_lease_data(l);
	struct pb_status *st = NULL;
	uint64_t cached_idle = 0;
	int hits = 0, pinned = 0;
	char extra[128];

	pb_set_cache_limit(c, 2 * bytes);
	if (pb_release(c, l) < 0)
		fprintf(stderr, "pb_release: %s\n", pb_last_error());
	/* The daemon should now count the cached buffer as cached-idle. */
	if (pb_status_get(c, &st) == 0) {
		cached_idle = st->cached_idle_bytes;
		pb_status_free(st);
	}
	for (int i = 0; i < reps; i++) {
		uint64_t t0 = now_ns();

		l = acquire_or_die(c, bytes, 0, "bench-cached");
		ms.push_back(ms_since(t0) * 1000.0); /* microseconds */
		hits += pb_lease_id(l) == id && pb_lease_data(l) == p;
		pinned += pb_lease_kind(l) == PB_MEM_PINNED;
		t0 = now_ns();
		if (pb_release(c, l) < 0)
			fprintf(stderr, "pb_release: %s\n", pb_last_error());
		free_ms.push_back(ms_since(t0) * 1000.0);
	}
	pb_set_cache_limit(c, 0); /* drops the cached buffer */
	snprintf(extra, sizeof(extra), "unit=us hits=%d/%d pinned=%d/%d daemon_cached_idle_bytes=%llu", hits, reps,
		 pinned, reps, (unsigned long long)cached_idle);
	setup_result(method, bytes, ms, free_ms, extra);
}

static int cmd_setup(const char *sock, const char *sock_huge, const char *sock_thp, const std::vector<size_t> &sizes,
		     int reps_small, int reps_large, int cached_reps)
{
	pb_client *c = NULL, *ch = NULL, *ct = NULL;
	double ctx_ms, conn_ms;
	uint64_t t0;

	init_cuda(&ctx_ms);
	printf("RESULT setup method=cuda-context size=- n=1 first_ms=%.3f median_ms=%.3f\n", ctx_ms, ctx_ms);
	if (sock) {
		t0 = now_ns();
		c = connect_or_die(sock);
		conn_ms = ms_since(t0);
		printf("RESULT setup method=pb_connect size=- n=1 first_ms=%.3f median_ms=%.3f\n", conn_ms, conn_ms);
	}
	if (sock_huge)
		ch = connect_or_die(sock_huge);
	if (sock_thp)
		ct = connect_or_die(sock_thp);

	for (size_t bytes : sizes) {
		int reps = bytes >= (1ull << 30) ? reps_large : reps_small;
		std::vector<double> ms, free_ms;

		for (int i = 0; i < reps; i++) {
			void *p;

			t0 = now_ns();
			CK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
			ms.push_back(ms_since(t0));
			t0 = now_ns();
			CK(cudaFreeHost(p));
			free_ms.push_back(ms_since(t0));
		}
		setup_result("cudaHostAlloc", bytes, ms, free_ms, NULL);

		ms.clear();
		free_ms.clear();
		for (int i = 0; i < reps; i++) {
			void *p;

			t0 = now_ns();
			p = malloc(bytes);
			if (!p) {
				fprintf(stderr, "malloc(%zu) failed\n", bytes);
				return 1;
			}
			CK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
			ms.push_back(ms_since(t0));
			t0 = now_ns();
			CK(cudaHostUnregister(p));
			free(p);
			free_ms.push_back(ms_since(t0));
		}
		setup_result("malloc+cudaHostRegister", bytes, ms, free_ms, NULL);

		if (c) {
			setup_broker_warm("broker-4k-warm", c, bytes, reps, 0);
			setup_broker_warm("broker-4k-map-only", c, bytes, reps, PB_ACQUIRE_NO_CUDA);
		}
		if (ch) {
			setup_broker_warm("broker-hugetlb-warm", ch, bytes, reps, 0);
			setup_broker_warm("broker-hugetlb-map-only", ch, bytes, reps, PB_ACQUIRE_NO_CUDA);
		}
		if (ct) {
			setup_broker_warm("broker-thp-warm", ct, bytes, reps, 0);
			setup_broker_warm("broker-thp-map-only", ct, bytes, reps, PB_ACQUIRE_NO_CUDA);
		}
		if (ch)
			setup_broker_cached("broker-hugetlb-cached", ch, bytes, cached_reps);
		if (c)
			setup_broker_cached("broker-4k-cached", c, bytes, cached_reps);
	}
	pb_disconnect(c);
	pb_disconnect(ch);
	pb_disconnect(ct);
	return 0;
}

/* ---------------------------------------------------------------- many jobs */

struct job_times {
	double ctx_ms;
	uint64_t setup0_ns, setup1_ns, copy0_ns, copy1_ns;
	double connect_ms;
	int kind; /* pb_memory_kind, or -1 for cudaHostAlloc */
	int gpu;  /* the CUDA device it ran on */
	int ok;
};

struct many_shared {
	struct proc_barrier bar;
	struct job_times t[64];
};

static int many_child(int idx, int procs, bool broker, const char *sock, size_t bytes, int passes,
		      struct many_shared *sh)
{
	struct job_times *t = &sh->t[idx];
	pb_client *c = NULL;
	pb_lease *l = NULL;
	void *host = NULL, *dev;
	cudaStream_t s;

	int ndev = 1;

	/* Jobs go round the GPUs (one GPU: all on it), as one job per GPU would on a multi-GPU host. */
	CK(cudaGetDeviceCount(&ndev));
	t->gpu = ndev > 0 ? idx % ndev : 0;
	init_cuda_on(t->gpu, &t->ctx_ms);
	CK(cudaMalloc(&dev, bytes));
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	if (barrier_wait(&sh->bar, 0, procs, BARRIER_GUARD_MS) < 0)
		return 1;

	/* Set-up: everything a job does before its first copy, after its CUDA context exists. */
	t->setup0_ns = now_ns();
	if (broker) {
		int r = connect_retry(sock, CONNECT_GUARD_MS, &c);
		char label[32];
		struct pb_acquire_opts ao = { 0, 0, PB_PRIORITY_NORMAL, label, 0, NULL };

		t->connect_ms = ms_since(t->setup0_ns);
		if (r < 0) {
			fprintf(stderr, "job %d: pb_connect: %s\n", idx, pb_last_error());
			sh->bar.failed = 1;
			return 1;
		}
		snprintf(label, sizeof(label), "bench-job-%d", idx);
		r = pb_acquire(c, bytes, &ao, &l);
		if (r < 0) {
			fprintf(stderr, "job %d: pb_acquire(%zu): %s\n", idx, bytes, pb_last_error());
			sh->bar.failed = 1;
			return 1;
		}
		host = pb_lease_data(l);
		t->kind = pb_lease_kind(l);
	} else {
		CK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
		t->kind = -1;
	}
	t->setup1_ns = now_ns();
	if (barrier_wait(&sh->bar, 1, procs, BARRIER_GUARD_MS) < 0)
		return 1;

	t->copy0_ns = now_ns();
	for (int i = 0; i < passes; i++)
		CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
	CK(cudaStreamSynchronize(s));
	t->copy1_ns = now_ns();
	t->ok = 1;

	if (broker) {
		if (pb_release(c, l) < 0)
			fprintf(stderr, "pb_release: %s\n", pb_last_error());
		pb_disconnect(c);
	} else {
		CK(cudaFreeHost(host));
	}
	CK(cudaFree(dev));
	CK(cudaStreamDestroy(s));
	return 0;
}

/* Run before any CUDA call in this process: a CUDA context does not survive fork. */
static int cmd_many(bool broker, const char *label, const char *sock, int procs, size_t bytes, int passes)
{
	struct many_shared *sh;
	pid_t pids[64];
	int failed = 0, pinned = 0, gpus = 0;
	uint64_t s0 = UINT64_MAX, s1 = 0, c0 = UINT64_MAX, c1 = 0;
	std::vector<double> setup_ms, ctx_ms, conn_ms, per_gbs;
	char sz[32];

	if (procs < 1 || procs > 64 || (broker && !sock))
		return 2;
	sh = (struct many_shared *)mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	memset(sh, 0, sizeof(*sh));
	for (int i = 0; i < procs; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			return 1;
		if (pids[i] == 0) {
			int r = many_child(i, procs, broker, sock, bytes, passes, sh);

			if (r)
				sh->bar.failed = 1;
			_exit(r);
		}
	}
	for (int n = 0; n < procs; n++) {
		int st = 0;
		pid_t pid = waitpid(-1, &st, 0);

		/* A job that died (a failed CUDA call exits at once) must not leave the others at a barrier. */
		if (pid > 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
			sh->bar.failed = 1;
	}
	for (int i = 0; i < procs; i++)
		if (!sh->t[i].ok)
			failed++;
	for (int i = 0; i < procs; i++) {
		struct job_times *t = &sh->t[i];

		if (!t->ok)
			continue;
		s0 = std::min(s0, t->setup0_ns);
		s1 = std::max(s1, t->setup1_ns);
		c0 = std::min(c0, t->copy0_ns);
		c1 = std::max(c1, t->copy1_ns);
		setup_ms.push_back((double)(t->setup1_ns - t->setup0_ns) / 1e6);
		ctx_ms.push_back(t->ctx_ms);
		conn_ms.push_back(t->connect_ms);
		per_gbs.push_back((double)bytes * passes / ((double)(t->copy1_ns - t->copy0_ns) / 1e9) / 1e9);
		pinned += t->kind == PB_MEM_PINNED || t->kind == -1;
	}
	for (int i = 0; i < procs; i++) {
		bool first = sh->t[i].ok;

		for (int k = 0; k < i && first; k++)
			first = !(sh->t[k].ok && sh->t[k].gpu == sh->t[i].gpu);
		gpus += first;
	}
	printf("RESULT many mode=%s procs=%d gpus=%d size=%s passes=%d failed=%d pinned=%d setup_wall_ms=%.1f "
	       "setup_median_ms=%.1f setup_max_ms=%.1f connect_median_ms=%.3f ctx_median_ms=%.1f h2d_aggregate_gbs=%.2f "
	       "h2d_per_job_median_gbs=%.2f copy_wall_ms=%.1f\n",
	       label && label[0] ? label
	       : broker          ? "broker"
				 : "cudaHostAlloc",
	       procs, gpus, size_label(bytes, sz, sizeof(sz)), passes, failed, pinned,
	       setup_ms.empty() ? NAN : (double)(s1 - s0) / 1e6, median(setup_ms), vmax(setup_ms),
	       broker ? median(conn_ms) : 0.0, median(ctx_ms),
	       setup_ms.empty() ? NAN
				: (double)bytes * passes * (double)setup_ms.size() / ((double)(c1 - c0) / 1e9) / 1e9,
	       median(per_gbs), setup_ms.empty() ? NAN : (double)(c1 - c0) / 1e6);
	return failed ? 1 : 0;
}

/* ---------------------------------------------------------------- pool warm-up */

/* What a job pays to pin total bytes itself: cudaHostAlloc in chunk-sized pieces. */
static int cmd_hostalloc_total(size_t total, size_t chunk)
{
	std::vector<void *> bufs;
	double ctx_ms, alloc_ms, free_ms;
	uint64_t t0;
	char sz[32], csz[32];

	init_cuda(&ctx_ms);
	t0 = now_ns();
	for (size_t done = 0; done < total; done += chunk) {
		void *p;

		CK(cudaHostAlloc(&p, std::min(chunk, total - done), cudaHostAllocDefault));
		bufs.push_back(p);
	}
	alloc_ms = ms_since(t0);
	t0 = now_ns();
	for (void *p : bufs)
		CK(cudaFreeHost(p));
	free_ms = ms_since(t0);
	printf("RESULT warmup method=cudaHostAlloc total=%s bytes=%zu chunk=%s ms=%.1f free_ms=%.1f ctx_ms=%.1f\n",
	       size_label(total, sz, sizeof(sz)), total, size_label(chunk, csz, sizeof(csz)), alloc_ms, free_ms,
	       ctx_ms);
	return 0;
}

/*
 * The other half of a like-for-like warm-up: after the daemon's pool is warm, one job takes all of it
 * in chunk-sized leases, each mapped and CUDA-registered, as cudaHostAlloc's pieces are. A warm pool
 * is locked but not registered (the daemon is CUDA-free), so start-to-READY alone compares memory that
 * is not yet usable for pinned copies with memory that is. The CUDA context is excluded on both sides.
 */
static int cmd_warm_register(const char *label, const char *sock, size_t total, size_t chunk)
{
	std::vector<pb_lease *> leases;
	double ctx_ms, reg_ms, free_ms;
	int pinned = 0;
	pb_client *c;
	uint64_t t0;
	char sz[32], csz[32];

	init_cuda(&ctx_ms);
	c = connect_or_die(sock);
	pb_set_cache_limit(c, 0);
	t0 = now_ns();
	for (size_t done = 0; done < total; done += chunk) {
		pb_lease *l = acquire_or_die(c, std::min(chunk, total - done), PB_ACQUIRE_NO_CACHE,
					     "bench-warm-register");

		pinned += pb_lease_kind(l) == PB_MEM_PINNED;
		leases.push_back(l);
	}
	reg_ms = ms_since(t0);
	t0 = now_ns();
	for (pb_lease *l : leases)
		if (pb_release(c, l) < 0)
			fprintf(stderr, "pb_release: %s\n", pb_last_error());
	free_ms = ms_since(t0);
	pb_disconnect(c);
	printf("RESULT warmup method=pinbrokerd-register label=%s total=%s bytes=%zu chunk=%s ms=%.1f free_ms=%.1f "
	       "ctx_ms=%.1f pinned=%d/%zu\n",
	       label, size_label(total, sz, sizeof(sz)), total, size_label(chunk, csz, sizeof(csz)), reg_ms, free_ms,
	       ctx_ms, pinned, leases.size());
	return pinned == (int)leases.size() ? 0 : 1;
}

/* The daemon's own "pool warmed: SIZE in X ms" log line, or NAN. */
static double log_warm_ms(const char *log_path)
{
	FILE *f = fopen(log_path, "r");
	char line[1024];
	double ms = NAN;

	if (!f)
		return NAN;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "pool warmed:"), *in;

		if (p && (in = strstr(p, " in ")))
			ms = strtod(in + 4, NULL);
	}
	fclose(f);
	return ms;
}

/*
 * Start pinbrokerd (argv: its path and arguments) and time it from fork until
 * its pool is warm: it answers a HELLO once listening, and a prewarm above
 * 1 GiB goes on warming beside its loop (status pool_warming) after that. The
 * daemon keeps running; its pid goes to pidfile.
 */
static int cmd_start_daemon(const char *label, const char *sock, const char *log_path, const char *pidfile, char **argv)
{
	uint64_t t0 = now_ns();
	pid_t pid = spawn_daemon(argv, log_path);
	pb_client *c = NULL;
	struct pb_status *st = NULL;
	double ready_ms;
	FILE *f;
	int r;

	if (pid < 0) {
		perror("fork");
		return 1;
	}
	r = connect_retry(sock, CONNECT_GUARD_MS, &c);
	if (r < 0) {
		fprintf(stderr, "%s did not answer on %s: %s (log %s)\n", argv[0], sock, pb_last_error(), log_path);
		kill(pid, SIGKILL);
		return 1;
	}
	/* Warm, not just listening: the results measure a warm pool. */
	while (pb_status_get(c, &st) == 0 && st->pool_warming && ms_since(t0) < CONNECT_GUARD_MS) {
		pb_status_free(st);
		st = NULL;
		usleep(10000);
	}
	if (st)
		pb_status_free(st);
	st = NULL;
	ready_ms = ms_since(t0);
	f = fopen(pidfile, "w");
	if (f) {
		fprintf(f, "%d\n", (int)pid);
		fclose(f);
	}
	r = pb_status_get(c, &st);
	printf("RESULT warmup method=pinbrokerd label=%s ready_ms=%.1f log_warm_ms=%.1f pool_bytes=%llu "
	       "pool_idle_bytes=%llu hugetlb=%d page_size=%llu budget=%llu pressure=%s\n",
	       label, ready_ms, log_warm_ms(log_path), r == 0 ? (unsigned long long)st->pool_bytes : 0ull,
	       r == 0 ? (unsigned long long)st->pool_idle_bytes : 0ull, r == 0 ? st->hugetlb : -1,
	       r == 0 ? (unsigned long long)st->page_size_bytes : 0ull,
	       r == 0 ? (unsigned long long)st->budget_bytes : 0ull,
	       r == 0 && st->pressure_state ? st->pressure_state : "?");
	if (r == 0)
		pb_status_free(st);
	pb_disconnect(c);
	return 0;
}

/* ---------------------------------------------------------------- info */

/* What the results were measured on, as META lines. */
static int cmd_info(void)
{
	struct cudaDeviceProp prop;
	int drv = 0, rt = 0;
	const char *why = NULL;

	CK(cudaDriverGetVersion(&drv));
	CK(cudaRuntimeGetVersion(&rt));
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("META gpu=%s (sm_%d%d, %.0f GiB)\n", prop.name, prop.major, prop.minor,
	       (double)prop.totalGlobalMem / (1ull << 30));
	printf("META cuda_driver_api=%d.%d\n", drv / 1000, (drv % 1000) / 10);
	printf("META cuda_runtime=%d.%d (static cudart, built with nvcc %d.%d)\n", rt / 1000, (rt % 1000) / 10,
	       __CUDACC_VER_MAJOR__, __CUDACC_VER_MINOR__);
	printf("META libpinbroker_cuda=%s\n", pb_cuda_available(&why) ? "usable" : why ? why : "not usable");
	return 0;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pb_gpu_bench bandwidth --socket S [--socket-huge S] [--socket-thp S] [--sizes 64M,1G] [--reps 11]\n"
		"       pb_gpu_bench setup --socket S [--socket-huge S] [--socket-thp S] [--sizes 2M,64M,1G] [--reps 11]\n"
		"                          [--reps-large 5]\n"
		"                          [--cached-reps 201]\n"
		"       pb_gpu_bench many --mode broker|cudaHostAlloc [--label L] [--socket S] [--procs 8] [--size 2G] [--passes 4]\n"
		"       pb_gpu_bench hostalloc-total [--size 16G] [--chunk 1G]\n"
		"       pb_gpu_bench warm-register --label L --socket S [--size 16G] [--chunk 1G]\n"
		"       pb_gpu_bench info\n"
		"       pb_gpu_bench start-daemon --label L --socket S --log FILE --pidfile FILE -- PINBROKERD ARGS...\n"
		"Prints RESULT lines (bench/gpu/report.py makes the tables); exits 77 without a GPU.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "socket-huge", required_argument, NULL, 'S' },
		{ "socket-thp", required_argument, NULL, 'T' },
		{ "sizes", required_argument, NULL, 'z' },
		{ "size", required_argument, NULL, 'b' },
		{ "reps", required_argument, NULL, 'r' },
		{ "reps-large", required_argument, NULL, 'R' },
		{ "cached-reps", required_argument, NULL, 'c' },
		{ "mode", required_argument, NULL, 'm' },
		{ "procs", required_argument, NULL, 'n' },
		{ "passes", required_argument, NULL, 'p' },
		{ "chunk", required_argument, NULL, 'k' },
		{ "label", required_argument, NULL, 'l' },
		{ "log", required_argument, NULL, 'L' },
		{ "pidfile", required_argument, NULL, 'P' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *cmd, *sock = NULL, *sock_huge = NULL, *sock_thp = NULL, *sizes = NULL, *mode = "broker",
			 *label = "", *log = NULL, *pidfile = NULL;
	size_t size = 0, chunk = 1ull << 30;
	int reps = 11, reps_large = 5, cached_reps = 201, procs = 8, passes = 4, ch;
	char gpu[256];

	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	cmd = argv[1];
	optind = 2;
	while ((ch = getopt_long(argc, argv, "+", lo, NULL)) != -1) {
		switch (ch) {
		case 's':
			sock = optarg;
			break;
		case 'S':
			sock_huge = optarg[0] ? optarg : NULL;
			break;
		case 'T':
			sock_thp = optarg[0] ? optarg : NULL;
			break;
		case 'z':
			sizes = optarg;
			break;
		case 'b':
			size = parse_size(optarg);
			break;
		case 'r':
			reps = atoi(optarg);
			break;
		case 'R':
			reps_large = atoi(optarg);
			break;
		case 'c':
			cached_reps = atoi(optarg);
			break;
		case 'm':
			mode = optarg;
			break;
		case 'n':
			procs = atoi(optarg);
			break;
		case 'p':
			passes = atoi(optarg);
			break;
		case 'k':
			chunk = parse_size(optarg);
			break;
		case 'l':
			label = optarg;
			break;
		case 'L':
			log = optarg;
			break;
		case 'P':
			pidfile = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (!strcmp(cmd, "start-daemon")) {
		if (!sock || !log || !pidfile || optind >= argc) {
			usage(stderr);
			return 2;
		}
		return cmd_start_daemon(label, sock, log, pidfile, argv + optind);
	}
	/* Everything else needs a GPU; ask in a child so "many" can still fork. */
	if (!gpu_probe(gpu, sizeof(gpu))) {
		printf("SKIP: %s\n", gpu);
		return GPU_EXIT_SKIP;
	}
	if (!strcmp(cmd, "info"))
		return cmd_info();
	if (!strcmp(cmd, "bandwidth")) {
		struct bw_opts o = { reps, 2 };

		return cmd_bandwidth(sock, sock_huge, sock_thp, parse_sizes(sizes ? sizes : "64M,1G"), &o);
	}
	if (!strcmp(cmd, "setup"))
		return cmd_setup(sock, sock_huge, sock_thp, parse_sizes(sizes ? sizes : "2M,64M,1G"), reps, reps_large,
				 cached_reps);
	if (!strcmp(cmd, "many"))
		return cmd_many(!strcmp(mode, "broker"), label, sock, procs, size ? size : 2ull << 30, passes);
	if (!strcmp(cmd, "hostalloc-total"))
		return cmd_hostalloc_total(size ? size : 16ull << 30, chunk);
	if (!strcmp(cmd, "warm-register")) {
		if (!sock) {
			usage(stderr);
			return 2;
		}
		return cmd_warm_register(label, sock, size ? size : 16ull << 30, chunk);
	}
	usage(stderr);
	return 2;
}
