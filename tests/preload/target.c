/* SPDX-License-Identifier: MIT */
/*
 * An unmodified CUDA program for the interposer's CPU tests: it knows nothing
 * of pinbroker. Built three ways from this file: against the runtime API with
 * the runtime as a shared library (libcudart.so.13), with the runtime
 * compiled in (nvcc's static default), and against the driver API
 * (TARGET_DRIVER, linked to libcuda.so.1). Under the stub libcuda it can say
 * what the "driver" pinned itself.
 *
 *   target hold KIND SIZE...   allocate, print "ready ..." and the driver's counts, wait for stdin to
 *                              close, check the data, free, print "freed ...", exit 0
 *   target expect-oom KIND SIZE  exit 0 when the allocation fails with the out-of-memory error
 *   target check               self-checks (flags, mapped pointers, threads, fork, pass-through)
 *   target fork-stress KIND SIZE N  fork N times while two threads allocate and free SIZE bytes of KIND;
 *                              each child allocates too and must exit within 10 s (alarm): exit 0 if all did
 * KIND: alloc, mallochost, mapped, wc, register, and the lookup paths a program may take instead of a
 * symbol: dlsym-driver (cuMemHostAlloc from dlsym on a libcuda.so.1 handle), dlsym-runtime
 * (cudaHostAlloc from dlsym(RTLD_DEFAULT), freed through the libcudart.so handle; the shared runtime
 * only), gpa-register-6000 (cuMemHostRegister from cuGetProcAddress at CUDA 6.0, itself from dlsym).
 * env PB_EXPECT=broker|driver: which of the two the checks expect to have served the memory.
 */
#define _GNU_SOURCE
#include "stub_cuda.h"
#include "target_check.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define HOST_PORTABLE 1u
#define HOST_MAPPED 2u
#define HOST_WC 4u

#ifdef TARGET_DRIVER
typedef int CUresult;
typedef uint64_t cuuint64_t;
CUresult cuInit(unsigned flags);
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytes);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemHostGetFlags(unsigned *flags, void *p);
CUresult cuMemHostGetDevicePointer_v2(unsigned long long *d, void *p, unsigned flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);

static int api_alloc(void **p, size_t n, unsigned flags, bool plain)
{
	return plain ? cuMemAllocHost_v2(p, n) : cuMemHostAlloc(p, n, flags);
}
#define api_free cuMemFreeHost
#define api_register cuMemHostRegister_v2
#define api_unregister cuMemHostUnregister
#define api_get_flags cuMemHostGetFlags
static int api_device_pointer(void **d, void *p)
{
	return cuMemHostGetDevicePointer_v2((unsigned long long *)d, p, 0);
}
#define API "driver"
#else
typedef int cudaError_t;
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t size);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t size, unsigned flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaHostGetFlags(unsigned *flags, void *p);
cudaError_t cudaHostGetDevicePointer(void **d, void *p, unsigned flags);

static int api_alloc(void **p, size_t n, unsigned flags, bool plain)
{
	return plain ? cudaMallocHost(p, n) : cudaHostAlloc(p, n, flags);
}
#define api_free cudaFreeHost
#define api_register cudaHostRegister
#define api_unregister cudaHostUnregister
#define api_get_flags cudaHostGetFlags
static int api_device_pointer(void **d, void *p)
{
	return cudaHostGetDevicePointer(d, p, 0);
}
#define API "runtime"
#endif

atomic_int failures;

static struct stub_cuda_stats stats(void)
{
	struct stub_cuda_stats s = { 0 };
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void (*get)(struct stub_cuda_stats *) = NULL;

	if (h) {
		*(void **)&get = dlsym(h, "stub_cuda_get_stats");
		if (get)
			get(&s);
		dlclose(h);
	}
	return s;
}

/* The stub's allocation that bypasses every interposable name (the runtime variants load libcuda late). */
static int untracked_alloc(void **p, size_t n)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	int (*alloc)(void **, size_t) = NULL;
	int r = -1;

	if (h) {
		*(void **)&alloc = dlsym(h, "stub_cuda_alloc_untracked");
		if (alloc)
			r = alloc(p, n);
		dlclose(h);
	}
	return r;
}

static size_t page(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

static size_t span(size_t n)
{
	return (n + page() - 1) / page() * page();
}

typedef int (*ptr_fn)(void *);
typedef int (*alloc_fn)(void **, size_t, unsigned);
typedef int (*register_fn)(void *, size_t, unsigned);
typedef int (*gpa_fn)(const char *, void **, int, uint64_t);

struct block {
	void *p;
	size_t n;
	bool registered; /* the program's own memory, registered */
	bool shm;        /* that memory is the /dev/shm file $PB_TEST_SHM, mapped shared (an LLM server's region) */
	ptr_fn put;      /* the free or unregister found the same way as the allocation; NULL: the API's */
};

/* A function looked up with dlsym on lib's handle, as the static runtime looks the driver up. */
static void *lookup(const char *lib, const char *name)
{
	/* The handle stays open: a library unloaded under the functions taken from it would crash. */
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

	return h ? dlsym(h, name) : NULL;
}

/* The lookup-path kinds of get_block. Returns the CUDA error, or -1 when the function cannot be found. */
static int get_looked_up(const char *kind, size_t n, struct block *b)
{
	alloc_fn alloc = NULL;
	register_fn reg = NULL;
	gpa_fn gpa = NULL;
	int r;

	if (strcmp(kind, "dlsym-driver") == 0) {
		*(void **)&alloc = lookup("libcuda.so.1", "cuMemHostAlloc");
		*(void **)&b->put = lookup("libcuda.so.1", "cuMemFreeHost");
		return alloc && b->put ? alloc(&b->p, n, 0) : -1;
	}
	if (strcmp(kind, "dlsym-runtime") == 0) {
		/* RTLD_DEFAULT: the interposer's own export comes before libcudart's in the global scope. */
		*(void **)&alloc = dlsym(RTLD_DEFAULT, "cudaHostAlloc");
		*(void **)&b->put = lookup("libcudart.so.13", "cudaFreeHost");
		return alloc && b->put ? alloc(&b->p, n, 0) : -1;
	}
	/* gpa-register-6000 */
	*(void **)&gpa = lookup("libcuda.so.1", "cuGetProcAddress");
	if (!gpa || gpa("cuMemHostRegister", (void **)&reg, 6000, 0) != 0 || !reg ||
	    gpa("cuMemHostUnregister", (void **)&b->put, 6000, 0) != 0 || !b->put)
		return -1;
	b->registered = true;
	if (posix_memalign(&b->p, page(), span(n)) != 0)
		return 2;
	r = reg(b->p, n, 0);
	if (r != 0)
		free(b->p);
	return r;
}

/* Allocate (or allocate and register) one block of the kind named. Returns the CUDA error. */
static int get_block(const char *kind, size_t n, struct block *b)
{
	int r;

	b->n = n;
	b->put = NULL;
	b->registered = strcmp(kind, "register") == 0 || strcmp(kind, "shm-register") == 0;
	b->shm = strcmp(kind, "shm-register") == 0;
	if (b->shm) {
		/* Every rank maps the one file and registers all of it, as vLLM's SharedOffloadRegion does. */
		int fd = getenv("PB_TEST_SHM") ? shm_open(getenv("PB_TEST_SHM"), O_RDWR | O_CREAT, 0600) : -1;

		if (fd < 0 || ftruncate(fd, (off_t)span(n)) != 0)
			return 2;
		b->p = mmap(NULL, span(n), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (b->p == MAP_FAILED)
			return 2;
		r = api_register(b->p, n, 0);
		if (r != 0)
			munmap(b->p, span(n));
		return r;
	}
	if (b->registered) {
		if (posix_memalign(&b->p, page(), span(n)) != 0)
			return 2;
		r = api_register(b->p, n, 0);
		if (r != 0)
			free(b->p);
		return r;
	}
	if (strncmp(kind, "dlsym-", 6) == 0 || strcmp(kind, "gpa-register-6000") == 0)
		return get_looked_up(kind, n, b);
	if (strcmp(kind, "mallochost") == 0)
		return api_alloc(&b->p, n, 0, true);
	if (strcmp(kind, "mapped") == 0)
		return api_alloc(&b->p, n, HOST_MAPPED, false);
	if (strcmp(kind, "wc") == 0)
		return api_alloc(&b->p, n, HOST_WC, false);
	return api_alloc(&b->p, n, 0, false);
}

static int put_block(struct block *b)
{
	int r;

	if (b->registered) {
		r = b->put ? b->put(b->p) : api_unregister(b->p);
		if (b->shm)
			munmap(b->p, span(b->n));
		else
			free(b->p);
		return r;
	}
	return b->put ? b->put(b->p) : api_free(b->p);
}

static void fill(struct block *b, unsigned seed)
{
	for (size_t i = 0; i < b->n; i += 511)
		((unsigned char *)b->p)[i] = (unsigned char)(i * 31 + seed);
}

static bool intact(const struct block *b, unsigned seed)
{
	for (size_t i = 0; i < b->n; i += 511)
		if (((unsigned char *)b->p)[i] != (unsigned char)(i * 31 + seed))
			return false;
	return true;
}

static bool expect_broker(void)
{
	const char *e = getenv("PB_EXPECT");

	return e && strcmp(e, "broker") == 0;
}

static int cmd_hold(const char *kind, int n, char **sizes)
{
	struct block b[16];
	struct stub_cuda_stats s;
	char buf[64];
	int k, r;

	if (n > 16)
		n = 16;
	for (k = 0; k < n; k++) {
		r = get_block(kind, strtoull(sizes[k], NULL, 0), &b[k]);
		if (r != 0) {
			printf("error %d\n", r);
			return 3;
		}
		fill(&b[k], (unsigned)k);
	}
	s = stats();
	printf("ready %s alloc=%llu reg=%llu\n", API, (unsigned long long)s.alloc_bytes,
	       (unsigned long long)s.registered_bytes);
	fflush(stdout);
	while (fgets(buf, sizeof(buf), stdin))
		;
	for (k = 0; k < n; k++) {
		CHECK(intact(&b[k], (unsigned)k), "block %d corrupted while held", k);
		r = put_block(&b[k]);
		CHECK(r == 0, "freeing block %d: error %d", k, r);
	}
	s = stats();
	printf("freed alloc=%llu reg=%llu\n", (unsigned long long)s.alloc_bytes,
	       (unsigned long long)s.registered_bytes);
	return failures ? 1 : 0;
}

static int cmd_expect_oom(const char *kind, const char *size)
{
	struct block b;
	int r = get_block(kind, strtoull(size, NULL, 0), &b);

	if (r == 0) {
		put_block(&b);
		fprintf(stderr, "expected the out-of-memory error, got memory\n");
		return 1;
	}
	printf("error %d\n", r);
	return r == 2 ? 0 : 1;
}

struct stress {
	const char *kind;
	size_t n;
	atomic_bool stop;
	atomic_ulong rounds;
};

static void *alloc_loop(void *arg)
{
	struct stress *st = arg;

	while (!atomic_load(&st->stop)) {
		struct block b;

		if (get_block(st->kind, st->n, &b) == 0)
			put_block(&b);
		atomic_fetch_add(&st->rounds, 1);
	}
	return NULL;
}

/*
 * fork() while other threads allocate, free and report: the child must find
 * none of the interposer's locks held by a thread it does not have. A child
 * that hangs is killed by its alarm and counted.
 */
static int cmd_fork_stress(const char *kind, const char *size, const char *count)
{
	struct stress st = { .kind = kind, .n = strtoull(size, NULL, 0) };
	int forks = atoi(count), hung = 0, bad = 0;
	pthread_t t[2];

	alarm(60); /* the parent too: a deadlock in fork's own handlers fails the run instead of hanging it */
	atomic_init(&st.stop, false);
	atomic_init(&st.rounds, 0);
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, alloc_loop, &st);
	while (atomic_load(&st.rounds) < 2)
		usleep(1000);
	for (int i = 0; i < forks; i++) {
		pid_t pid;

		fflush(NULL);
		pid = fork();
		if (pid == 0) {
			struct block b;

			alarm(10);
			if (get_block(kind, st.n, &b) != 0 || put_block(&b) != 0)
				_exit(1);
			_exit(0);
		}
		tally_child(pid, &bad, &hung);
	}
	atomic_store(&st.stop, true);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	CHECK(hung == 0, "%d of %d children hung after fork", hung, forks);
	CHECK(bad == 0, "%d of %d children failed", bad, forks);
	printf("fork-stress %s: %d forks, %lu rounds in the threads, %d hung, %d failed\n", API, forks,
	       (unsigned long)atomic_load(&st.rounds), hung, bad);
	return failures ? 1 : 0;
}

static void *churn(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;

	for (int i = 0; i < 50; i++) {
		struct block b;
		unsigned flags = 0;
		int r = get_block(i % 3 == 0 ? "mallochost" : "alloc", 4096 * (size_t)(1 + (seed + i) % 7) + 17, &b);

		CHECK(r == 0, "thread %u: allocation %d: error %d", seed, i, r);
		if (r != 0)
			continue;
		fill(&b, seed + (unsigned)i);
		if (expect_broker()) {
			CHECK(api_get_flags(&flags, b.p) == 0 && flags == (HOST_PORTABLE | HOST_MAPPED),
			      "thread %u: flags %u", seed, flags);
		}
		CHECK(intact(&b, seed + (unsigned)i), "thread %u: data", seed);
		CHECK(put_block(&b) == 0, "thread %u: free", seed);
	}
	return NULL;
}

static int cmd_check(void)
{
	struct stub_cuda_stats s0, s1;
	struct block a, m, w, r;
	unsigned flags = 0;
	void *dev = NULL, *untracked = NULL;
	pthread_t t[8];
	int rc, status;
	pid_t pid;

#ifdef TARGET_DRIVER
	CHECK(cuInit(0) == 0, "cuInit");
#endif
	/* Allocations: who served them, and what the flags say. */
	CHECK(get_block("alloc", 100000, &a) == 0, "cudaHostAlloc");
	s0 = stats();
	if (expect_broker()) {
		CHECK(s0.alloc_bytes == 0, "the driver allocated %llu bytes itself",
		      (unsigned long long)s0.alloc_bytes);
		CHECK(s0.registered_bytes == span(100000), "registered %llu", (unsigned long long)s0.registered_bytes);
		CHECK(api_get_flags(&flags, a.p) == 0 && flags == (HOST_PORTABLE | HOST_MAPPED), "flags %u", flags);
		CHECK(api_get_flags(&flags, (char *)a.p + 4096) == 0, "flags of an inner pointer");
	} else {
		CHECK(s0.alloc_bytes == 100000, "driver bytes %llu", (unsigned long long)s0.alloc_bytes);
	}
	/* A mapped allocation has a device pointer, and a kernel's view of it (here: the same address). */
	CHECK(get_block("mapped", 8192, &m) == 0, "mapped allocation");
	CHECK(api_device_pointer(&dev, m.p) == 0 && dev == m.p, "device pointer %p for %p", dev, m.p);
	/* Write-combined memory comes from the driver in every case. */
	s0 = stats();
	CHECK(get_block("wc", 65536, &w) == 0, "write-combined allocation");
	s1 = stats();
	CHECK(s1.alloc_bytes - s0.alloc_bytes == 65536, "write-combined memory is the driver's");
	CHECK(api_get_flags(&flags, w.p) == 0 && flags == HOST_WC, "write-combined flags %u", flags);
	/* Registration of the program's own memory reaches the driver. */
	CHECK(get_block("register", 3 * 4096 + 5, &r) == 0, "registration");
	s1 = stats();
	CHECK(s1.registered_bytes - s0.registered_bytes == 3 * 4096 + 5, "registered bytes");
	CHECK(api_register(r.p, 4096, 0) == 712, "registering twice is the driver's error");
	CHECK(api_unregister((char *)r.p + 4096) == 713, "unregistering an inner pointer is the driver's error");

	/* Memory the interposer never saw passes straight through. */
	CHECK(untracked_alloc(&untracked, 4096) == 0, "untracked allocation");
	CHECK(api_free(untracked) == 0, "freeing untracked memory");
	CHECK(api_free(untracked) != 0, "freeing it twice is the driver's error");

	/* Threads. */
	for (unsigned i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)i);
	for (unsigned i = 0; i < 8; i++)
		pthread_join(t[i], NULL);

	/* fork: the child may free what it inherited (its copy only) and allocate its own. */
	fill(&a, 7);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct block c;
		int bad = 0;

		bad |= !intact(&a, 7);
		bad |= api_free(a.p) != 0;
		bad |= get_block("alloc", 12345, &c) != 0;
		if (!bad) {
			fill(&c, 3);
			bad |= !intact(&c, 3);
			bad |= put_block(&c) != 0;
		}
		_exit(bad);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "forked child");
	CHECK(intact(&a, 7), "the parent's block after the child freed its copy");

	/* The lookup paths: dlsym on the driver's handle, and cuGetProcAddress at CUDA 6.0 for registration. */
	{
		struct block l, g;

		s0 = stats();
		CHECK(get_block("dlsym-driver", 3 * 4096 + 1, &l) == 0, "cuMemHostAlloc through dlsym");
		CHECK(get_block("gpa-register-6000", 2 * 4096, &g) == 0, "cuMemHostRegister through cuGetProcAddress");
		s1 = stats();
		CHECK(s1.registered_bytes - s0.registered_bytes ==
			      (expect_broker() ? span(3 * 4096 + 1) : 0) + 2 * 4096,
		      "registered %llu", (unsigned long long)(s1.registered_bytes - s0.registered_bytes));
		if (expect_broker()) {
			CHECK(s1.alloc_bytes == s0.alloc_bytes, "dlsym's cuMemHostAlloc reached the driver");
			CHECK(api_get_flags(&flags, l.p) == 0 && flags == (HOST_PORTABLE | HOST_MAPPED), "flags %u",
			      flags);
		}
		CHECK(put_block(&l) == 0 && put_block(&g) == 0, "freeing what the lookups gave");
	}

#ifdef TARGET_DRIVER
	{
		/* cuGetProcAddress: CUDA 3.0's cuMemAllocHost takes an unsigned int; 3.2's a size_t. */
		CUresult (*v1)(void **, unsigned) = NULL;
		CUresult (*v2)(void **, size_t) = NULL;
		void *p1 = NULL, *p2 = NULL;

		CHECK(cuGetProcAddress("cuMemAllocHost", (void **)&v1, 3000, 0) == 0 && v1, "cuGetProcAddress v1");
		CHECK(cuGetProcAddress("cuMemAllocHost", (void **)&v2, 13000, 0) == 0 && v2, "cuGetProcAddress v2");
		s0 = stats();
		CHECK(v1 && v1(&p1, 8192) == 0, "cuMemAllocHost (3.0)");
		CHECK(v2 && v2(&p2, 8192) == 0, "cuMemAllocHost_v2");
		s1 = stats();
		if (expect_broker())
			CHECK(s1.alloc_bytes == s0.alloc_bytes, "cuGetProcAddress's functions reached the driver");
		CHECK(p1 && cuMemFreeHost(p1) == 0, "free v1");
		CHECK(p2 && cuMemFreeHost(p2) == 0, "free v2");
	}
#endif
	rc = put_block(&a) | put_block(&m) | put_block(&w) | put_block(&r);
	CHECK(rc == 0, "freeing everything");
	s1 = stats();
	CHECK(s1.alloc_bytes == 0 && s1.registered_bytes == 0, "left pinned: %llu allocated, %llu registered",
	      (unsigned long long)s1.alloc_bytes, (unsigned long long)s1.registered_bytes);
	printf("check %s: %d failures\n", API, failures);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && strcmp(argv[1], "hold") == 0)
		return cmd_hold(argv[2], argc - 3, argv + 3);
	if (argc == 4 && strcmp(argv[1], "expect-oom") == 0)
		return cmd_expect_oom(argv[2], argv[3]);
	if (argc == 2 && strcmp(argv[1], "check") == 0)
		return cmd_check();
	if (argc == 5 && strcmp(argv[1], "fork-stress") == 0)
		return cmd_fork_stress(argv[2], argv[3], argv[4]);
	fprintf(stderr, "usage: %s hold KIND SIZE... | expect-oom KIND SIZE | check | fork-stress KIND SIZE N\n",
		argv[0]);
	return 2;
}
