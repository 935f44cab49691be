// SPDX-License-Identifier: MIT
// Staged copies on the real GPU (issue 39): an unmodified CUDA program (runtime and driver API, the shared
// runtime so the interposer sees cudaMemcpy*) that tests/gpu/run-staging.sh runs bare and under `pinctl run`.
// Every check prints PASS or FAIL; INFO lines (results that depend on the driver, not on pinbroker) must be the
// same bare and interposed. The last line is "staging_prog: N passed, M failed".
//
// usage: staging_prog probe       the GPU, driver and runtime (exit 77 without a device)
//        staging_prog check       bytes, APIs, ordering, threads, capture, pinned/managed passthrough
//        staging_prog hold MODE   MODE staged: copy 64 MiB + 1 both ways, or passthrough: only copies that must go to
//                                 the driver; then print "hold" and wait until the file $PB_HOLD_RELEASE exists (the
//                                 script reads the leases meanwhile)
// The slot, ring and threshold boundaries come from $PINBROKER_STAGING_SLOT / _RING / _THRESHOLD (the defaults
// otherwise), so a run with a small slot crosses many of them.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <string>
#include <thread>
#include <vector>

static int passed, failed;

static void result(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void result(bool ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s ", ok ? "PASS" : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	(ok ? passed : failed)++;
}

#define RT(call)                                                                                          \
	do {                                                                                              \
		cudaError_t e_ = (call);                                                                  \
		if (e_ != cudaSuccess) {                                                                  \
			printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
			failed++;                                                                         \
			return;                                                                           \
		}                                                                                         \
	} while (0)

static size_t env_size(const char *name, size_t dflt)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return dflt;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	switch (toupper((unsigned char)*end)) {
	case 'K':
		v <<= 10;
		break;
	case 'M':
		v <<= 20;
		break;
	case 'G':
		v <<= 30;
		break;
	default:
		break;
	}
	return (size_t)v;
}

static size_t SLOT, RING, THRESHOLD;

// A pattern that differs at every offset and with every seed (8 bytes per xorshift step: fast enough for GiBs).
static void fill(unsigned char *p, size_t n, unsigned seed)
{
	uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32 | seed);
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
	for (; i < n; i++)
		p[i] = (unsigned char)(x >> (8 * (i % 8))) ^ (unsigned char)i;
}

static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return i;
	return n;
}

__global__ void spin_then_fill(unsigned char *p, size_t n, unsigned char v, long long cycles)
{
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		long long t0 = clock64();
		while (clock64() - t0 < cycles) {
		}
	}
	__syncthreads();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = v;
}

__global__ void spin(long long cycles)
{
	long long t0 = clock64();
	while (clock64() - t0 < cycles) {
	}
}

__global__ void checksum(const unsigned char *p, size_t n, unsigned long long *out)
{
	unsigned long long s = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		s += (unsigned long long)p[i] * (i % 251 + 1);
	atomicAdd(out, s);
}

static unsigned long long host_checksum(const unsigned char *p, size_t n)
{
	unsigned long long s = 0;
	for (size_t i = 0; i < n; i++)
		s += (unsigned long long)p[i] * (i % 251 + 1);
	return s;
}

static const long long MS = 1500000; // clock64 cycles in about 1 ms (1.5-2 GHz)

// ---------------------------------------------------------------- bytes exact, every entry point

enum api {
	RT_SYNC,
	RT_ASYNC,
	RT_DEFAULT,
	RT_DEFAULT_ASYNC,
	RT_PER_THREAD,
	DRV_SYNC,
	DRV_ASYNC,
	DRV_UNIFIED,
	DRV_UNIFIED_ASYNC,
	N_API
};
static const char *const api_name[N_API] = { "cudaMemcpy",
					     "cudaMemcpyAsync",
					     "cudaMemcpyDefault",
					     "cudaMemcpyAsync(Default)",
					     "cudaMemcpyAsync(per-thread)",
					     "cuMemcpyHtoD/DtoH",
					     "cuMemcpyHtoDAsync/DtoHAsync",
					     "cuMemcpy",
					     "cuMemcpyAsync" };

// One H2D and one D2H of n bytes with api; the pinned judge (not staged) reads and writes the device side.
static bool copy_pair(api a, unsigned char *host, unsigned char *dev, size_t n, cudaStream_t s, std::string &why)
{
	cudaError_t e = cudaSuccess;
	CUresult r = CUDA_SUCCESS;
	CUdeviceptr d = (CUdeviceptr)(uintptr_t)dev;
	switch (a) {
	case RT_SYNC:
		e = cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice);
		break;
	case RT_ASYNC:
		e = cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s);
		break;
	case RT_DEFAULT:
		e = cudaMemcpy(dev, host, n, cudaMemcpyDefault);
		break;
	case RT_DEFAULT_ASYNC:
		e = cudaMemcpyAsync(dev, host, n, cudaMemcpyDefault, s);
		break;
	case RT_PER_THREAD:
		e = cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, cudaStreamPerThread);
		break;
	case DRV_SYNC:
		r = cuMemcpyHtoD(d, host, n);
		break;
	case DRV_ASYNC:
		r = cuMemcpyHtoDAsync(d, host, n, (CUstream)s);
		break;
	case DRV_UNIFIED:
		r = cuMemcpy(d, (CUdeviceptr)(uintptr_t)host, n);
		break;
	case DRV_UNIFIED_ASYNC:
		r = cuMemcpyAsync(d, (CUdeviceptr)(uintptr_t)host, n, (CUstream)s);
		break;
	default:
		break;
	}
	if (e != cudaSuccess || r != CUDA_SUCCESS) {
		why = std::string("H2D failed: ") + (e != cudaSuccess ? cudaGetErrorString(e) : std::to_string(r));
		return false;
	}
	return true;
}

static bool copy_back(api a, unsigned char *host, unsigned char *dev, size_t n, cudaStream_t s, std::string &why)
{
	cudaError_t e = cudaSuccess;
	CUresult r = CUDA_SUCCESS;
	CUdeviceptr d = (CUdeviceptr)(uintptr_t)dev;
	switch (a) {
	case RT_SYNC:
		e = cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost);
		break;
	case RT_ASYNC:
		e = cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s);
		break;
	case RT_DEFAULT:
		e = cudaMemcpy(host, dev, n, cudaMemcpyDefault);
		break;
	case RT_DEFAULT_ASYNC:
		e = cudaMemcpyAsync(host, dev, n, cudaMemcpyDefault, s);
		break;
	case RT_PER_THREAD:
		e = cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, cudaStreamPerThread);
		break;
	case DRV_SYNC:
		r = cuMemcpyDtoH(host, d, n);
		break;
	case DRV_ASYNC:
		r = cuMemcpyDtoHAsync(host, d, n, (CUstream)s);
		break;
	case DRV_UNIFIED:
		r = cuMemcpy((CUdeviceptr)(uintptr_t)host, d, n);
		break;
	case DRV_UNIFIED_ASYNC:
		r = cuMemcpyAsync((CUdeviceptr)(uintptr_t)host, d, n, (CUstream)s);
		break;
	default:
		break;
	}
	if (e != cudaSuccess || r != CUDA_SUCCESS) {
		why = std::string("D2H failed: ") + (e != cudaSuccess ? cudaGetErrorString(e) : std::to_string(r));
		return false;
	}
	// Pageable D2H returns with the data in place, async or not: no synchronisation before the check.
	return true;
}

static void bytes_exact()
{
	std::vector<size_t> sizes = {
		THRESHOLD - 1, THRESHOLD,    THRESHOLD + 1, SLOT - 1, SLOT,     SLOT + 1,
		2 * SLOT - 1,  2 * SLOT + 1, RING - 1,      RING,     RING + 1, 3 * RING + 12345
	};
	const size_t host_off[] = { 0, 1, 4095 };
	const size_t dev_off[] = { 0, 1, 256 };
	size_t max = 0;
	for (size_t n : sizes)
		max = n > max ? n : max;
	max += 8192;
	unsigned char *src = (unsigned char *)malloc(max), *dst = (unsigned char *)malloc(max), *judge, *dev;
	RT(cudaMallocHost((void **)&judge, max));
	RT(cudaMalloc((void **)&dev, max));
	cudaStream_t s;
	RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	unsigned seed = 1;
	for (int a = 0; a < N_API; a++) {
		int ok = 0, bad = 0;
		std::string first;
		for (size_t n : sizes)
			for (size_t ho : host_off)
				for (size_t dof : dev_off) {
					// Every alignment up to two slots; beyond, aligned and both off by one only.
					if (n > 2 * SLOT + 1 && (ho || dof) && !(ho == 1 && dof == 1))
						continue;
					std::string why;
					fill(src + ho, n, seed++);
					memset(dst, 0xEE, ho + n + 1);
					bool good = copy_pair((api)a, src + ho, dev + dof, n, s, why);
					if (good) {
						// the judge: a pinned copy, which the interposer passes to the driver as it is
						cudaDeviceSynchronize();
						cudaStreamSynchronize(cudaStreamPerThread);
						cudaMemcpy(judge, dev + dof, n, cudaMemcpyDeviceToHost);
						size_t at = first_diff(judge, src + ho, n);
						if (at != n) {
							good = false;
							why = "H2D wrong at byte " + std::to_string(at);
						}
					}
					if (good) {
						fill(judge, n, seed++);
						cudaMemcpy(dev + dof, judge, n, cudaMemcpyHostToDevice);
						good = copy_back((api)a, dst + ho, dev + dof, n, s, why);
						size_t at = good ? first_diff(dst + ho, judge, n) : n;
						if (good && at != n) {
							good = false;
							why = "D2H wrong at byte " + std::to_string(at);
						}
						if (good && ((ho && dst[ho - 1] != 0xEE) || dst[ho + n] != 0xEE)) {
							good = false;
							why = "D2H wrote outside its range";
						}
					}
					if (good)
						ok++;
					else {
						bad++;
						if (first.empty())
							first = "size " + std::to_string(n) + " host+" +
								std::to_string(ho) + " dev+" + std::to_string(dof) +
								": " + why;
					}
				}
		result(bad == 0, "%s: %d copies each way bytes exact around slot %zu / ring %zu / threshold %zu%s%s",
		       api_name[a], ok, SLOT, RING, THRESHOLD, bad ? "; first failure: " : "", first.c_str());
	}
	cudaStreamDestroy(s);
	cudaFree(dev);
	cudaFreeHost(judge);
	free(src);
	free(dst);
}

// ---------------------------------------------------------------- ordering against kernels and other streams

static void ordering()
{
	size_t n = 4 * SLOT + 333;
	unsigned char *src = (unsigned char *)malloc(n), *dst = (unsigned char *)malloc(n), *dev;
	unsigned long long *sum;
	RT(cudaMalloc((void **)&dev, n));
	RT(cudaMalloc((void **)&sum, sizeof *sum));
	cudaStream_t a, b;
	RT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
	RT(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));

	// A kernel that fills the buffer late, then a D2H on the same stream: the D2H sees the kernel's bytes.
	spin_then_fill<<<64, 256, 0, a>>>(dev, n, 0x5A, 50 * MS);
	RT(cudaMemcpyAsync(dst, dev, n, cudaMemcpyDeviceToHost, a));
	result(first_diff(dst, std::vector<unsigned char>(n, 0x5A).data(), n) == n,
	       "D2H after a slow kernel on the same stream sees the kernel's bytes (returned with them in place)");

	// A slow kernel filling the buffer, then an H2D on the same stream: the H2D's bytes win.
	fill(src, n, 77);
	spin_then_fill<<<64, 256, 0, a>>>(dev, n, 0xA5, 50 * MS);
	RT(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, a));
	RT(cudaStreamSynchronize(a));
	RT(cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost));
	result(first_diff(dst, src, n) == n, "H2D after a slow kernel on the same stream lands after it");

	// The source may be reused as soon as an async H2D returns: overwrite it at once.
	fill(src, n, 78);
	std::vector<unsigned char> want(src, src + n);
	spin<<<1, 1, 0, a>>>(30 * MS); // the stream is busy: the DMA cannot have run yet
	RT(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, a));
	memset(src, 0, n);
	RT(cudaStreamSynchronize(a));
	RT(cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost));
	result(first_diff(dst, want.data(), n) == n, "an async H2D's source may be reused once it returns");

	// H2D then a kernel on the same stream: the kernel reads the copied bytes.
	fill(src, n, 79);
	RT(cudaMemsetAsync(sum, 0, sizeof *sum, a));
	RT(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, a));
	checksum<<<64, 256, 0, a>>>(dev, n, sum);
	unsigned long long got = 0;
	RT(cudaMemcpyAsync(&got, sum, sizeof got, cudaMemcpyDeviceToHost, a)); // small: not staged
	RT(cudaStreamSynchronize(a));
	result(got == host_checksum(src, n), "a kernel after an H2D on the same stream reads its bytes");

	// H2D on stream a, an event, a kernel on stream b waiting for it.
	fill(src, n, 80);
	cudaEvent_t ev;
	RT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	RT(cudaMemsetAsync(sum, 0, sizeof *sum, b));
	RT(cudaStreamSynchronize(b));
	spin<<<1, 1, 0, a>>>(20 * MS);
	RT(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, a));
	RT(cudaEventRecord(ev, a));
	RT(cudaStreamWaitEvent(b, ev, 0));
	checksum<<<64, 256, 0, b>>>(dev, n, sum);
	RT(cudaStreamSynchronize(b));
	RT(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost));
	result(got == host_checksum(src, n),
	       "a kernel on another stream, waiting on an event after the H2D, reads its bytes");

	// The legacy default stream orders against blocking streams: sync cudaMemcpy after a kernel on stream 0.
	spin_then_fill<<<64, 256>>>(dev, n, 0x3C, 30 * MS);
	RT(cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost));
	result(first_diff(dst, std::vector<unsigned char>(n, 0x3C).data(), n) == n,
	       "a sync D2H after a kernel on the legacy default stream sees its bytes");
	// A sync H2D then a kernel on the default stream.
	fill(src, n, 81);
	RT(cudaMemcpy(dev, src, n, cudaMemcpyHostToDevice));
	RT(cudaMemset(sum, 0, sizeof *sum));
	checksum<<<64, 256>>>(dev, n, sum);
	RT(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost));
	result(got == host_checksum(src, n), "a kernel after a sync H2D on the default stream reads its bytes");

	cudaEventDestroy(ev);
	cudaStreamDestroy(a);
	cudaStreamDestroy(b);
	cudaFree(dev);
	cudaFree(sum);
	free(src);
	free(dst);
}

// ---------------------------------------------------------------- many host threads

static void threads()
{
	const int T = 8;
	std::atomic<int> bad{ 0 };
	std::vector<std::thread> th;
	for (int t = 0; t < T; t++)
		th.emplace_back([t, &bad] {
			size_t n = 2 * SLOT + 4096 * t + t;
			unsigned char *src = (unsigned char *)malloc(n), *dst = (unsigned char *)malloc(n), *dev;
			cudaStream_t s;
			if (cudaMalloc((void **)&dev, n) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess) {
				bad++;
				return;
			}
			for (int r = 0; r < 6; r++) {
				fill(src, n, 1000 * t + r);
				memset(dst, 0, n);
				bool ok = (r % 2 ? cudaMemcpy(dev, src, n, cudaMemcpyHostToDevice)
						 : cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, s)) ==
						  cudaSuccess &&
					  (r % 2 ? cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost)
						 : cudaMemcpyAsync(dst, dev, n, cudaMemcpyDeviceToHost, s)) ==
						  cudaSuccess &&
					  memcmp(src, dst, n) == 0;
				if (!ok)
					bad++;
			}
			cudaStreamDestroy(s);
			cudaFree(dev);
			free(src);
			free(dst);
		});
	for (auto &x : th)
		x.join();
	result(bad == 0, "%d host threads, 6 round trips each (sync and async, own streams): %d wrong", T, bad.load());
}

// ---------------------------------------------------------------- passthrough: capture, pinned, managed, registered

static void capture()
{
	size_t n = 2 * SLOT + 5;
	unsigned char *src = (unsigned char *)malloc(n), *dst = (unsigned char *)malloc(n), *dev;
	RT(cudaMalloc((void **)&dev, n));
	cudaStream_t s;
	RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	fill(src, n, 90);
	cudaGraph_t g = nullptr;
	cudaGraphExec_t ge = nullptr;
	cudaError_t e1 = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
	cudaError_t e2 = cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, s);
	cudaError_t e3 = cudaStreamEndCapture(s, &g);
	printf("INFO capture of a pageable H2D: begin %s, memcpy %s, end %s\n", cudaGetErrorName(e1),
	       cudaGetErrorName(e2), cudaGetErrorName(e3));
	cudaGetLastError();
	if (e1 == cudaSuccess && e2 == cudaSuccess && e3 == cudaSuccess) {
		bool ok = cudaGraphInstantiate(&ge, g, 0) == cudaSuccess && cudaGraphLaunch(ge, s) == cudaSuccess &&
			  cudaStreamSynchronize(s) == cudaSuccess;
		ok = ok && cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(dst, src, n) == 0;
		// The graph's node names the program's own buffer (passthrough): a second launch copies what it holds now.
		fill(src, n, 91);
		ok = ok && cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess &&
		     cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(dst, src, n) == 0;
		result(ok,
		       "a captured pageable H2D is the driver's node on the program's buffer (two launches, bytes exact)");
	} else {
		// The driver refused it: the interposer must refuse it the same way (INFO lines compared), and the stream
		// must work after.
		bool ok = cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, s) == cudaSuccess &&
			  cudaStreamSynchronize(s) == cudaSuccess &&
			  cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(dst, src, n) == 0;
		result(ok, "after a refused capture the stream copies bytes exact");
	}
	if (ge)
		cudaGraphExecDestroy(ge);
	if (g)
		cudaGraphDestroy(g);
	cudaStreamDestroy(s);
	cudaFree(dev);
	free(src);
	free(dst);
}

// Copies that must reach the driver untouched; bytes exact. The lease check (no ring taken) is run-staging.sh's.
static void passthrough_copies(bool report)
{
	size_t n = 2 * SLOT + 3;
	unsigned char *pinned, *managed, *dev;
	unsigned char *reg = (unsigned char *)malloc(n), *small = (unsigned char *)malloc(THRESHOLD);
	std::vector<unsigned char> want(n), got(n);
	RT(cudaMallocHost((void **)&pinned, n));
	RT(cudaMallocManaged((void **)&managed, n));
	RT(cudaMalloc((void **)&dev, n));
	RT(cudaHostRegister(reg, n, cudaHostRegisterDefault));
	struct {
		const char *what;
		unsigned char *p;
		size_t len;
	} cases[] = { { "pinned (cudaMallocHost)", pinned, n },
		      { "managed (cudaMallocManaged)", managed, n },
		      { "registered (cudaHostRegister)", reg, n },
		      { "pageable under the threshold", small, THRESHOLD - 1 } };
	unsigned seed = 500;
	for (auto &c : cases) {
		fill(want.data(), c.len, seed++);
		memcpy(c.p, want.data(), c.len);
		bool ok = cudaMemcpy(dev, c.p, c.len, cudaMemcpyHostToDevice) == cudaSuccess;
		memset(c.p, 0, c.len);
		ok = ok && cudaMemcpy(c.p, dev, c.len, cudaMemcpyDeviceToHost) == cudaSuccess &&
		     memcmp(c.p, want.data(), c.len) == 0;
		ok = ok && cudaMemcpy(dev, c.p, c.len, cudaMemcpyDefault) == cudaSuccess;
		if (report)
			result(ok, "%s: both ways bytes exact", c.what);
		else if (!ok)
			failed++;
	}
	cudaHostUnregister(reg);
	cudaFreeHost(pinned);
	cudaFree(managed);
	cudaFree(dev);
	free(reg);
	free(small);
}

static void hold(const char *mode)
{
	if (!strcmp(mode, "staged")) {
		size_t n = 64 * ((size_t)1 << 20) + 1;
		unsigned char *src = (unsigned char *)malloc(n), *dst = (unsigned char *)malloc(n), *dev;
		RT(cudaMalloc((void **)&dev, n));
		fill(src, n, 7);
		RT(cudaMemcpy(dev, src, n, cudaMemcpyHostToDevice));
		RT(cudaMemcpy(dst, dev, n, cudaMemcpyDeviceToHost));
		result(memcmp(src, dst, n) == 0, "hold staged: 64 MiB + 1 both ways bytes exact");
	} else {
		passthrough_copies(true);
	}
	printf("hold\n");
	fflush(stdout);
	// Until the script has read the leases: it creates $PB_HOLD_RELEASE (2 minutes at most).
	const char *rel = getenv("PB_HOLD_RELEASE");
	for (int i = 0; rel && i < 12000 && access(rel, F_OK) != 0; i++)
		usleep(10000);
}

int main(int argc, char **argv)
{
	SLOT = env_size("PINBROKER_STAGING_SLOT", 8u << 20);
	RING = env_size("PINBROKER_STAGING_RING", 64u << 20);
	THRESHOLD = env_size("PINBROKER_STAGING_THRESHOLD", 1u << 20);
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		printf("SKIP staging_prog: no CUDA device\n");
		return 77;
	}
	cudaFree(nullptr); // the primary context current, for the driver API calls
	if (argc >= 2 && !strcmp(argv[1], "probe")) {
		cudaDeviceProp p;
		int drv = 0, rt = 0;
		cudaGetDeviceProperties(&p, 0);
		cudaDriverGetVersion(&drv);
		cudaRuntimeGetVersion(&rt);
		printf("GPU: %s, driver API %d.%d, runtime %d.%d (shared), %d device(s)\n", p.name, drv / 1000,
		       drv % 1000 / 10, rt / 1000, rt % 1000 / 10, n);
		return 0;
	}
	if (argc >= 3 && !strcmp(argv[1], "hold"))
		hold(argv[2]);
	else if (argc >= 2 && !strcmp(argv[1], "check")) {
		printf("INFO slot %zu ring %zu threshold %zu\n", SLOT, RING, THRESHOLD);
		bytes_exact();
		ordering();
		threads();
		capture();
		passthrough_copies(true);
	} else {
		fprintf(stderr, "usage: %s probe | check | hold staged|passthrough\n", argv[0]);
		return 2;
	}
	printf("staging_prog: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
