/* SPDX-License-Identifier: MIT */
/*
 * An unmodified CUDA program that pins host memory the ways where the driver owns the pages (issue 26, item 3), for
 * tests/gpu/run-cudapaths.sh: run under `pinctl run`, the broker's figures must follow it; run bare, it is the
 * control. It includes nothing of pinbroker. The runtime's calls reach the driver through cuGetProcAddress (nvcc's
 * static runtime dlopen()s libcuda.so.1), and the VMM calls, which the runtime lacks, come from
 * cudaGetDriverEntryPointByVersion as NCCL takes them.
 *
 * usage: cudapaths_prog probe               print the GPU; exit 0, or 77 without one
 *        cudapaths_prog PATH SIZE            the steps of PATH, one line each, "STEP rc=N bytes=B": rc the CUDA
 *                                            error (0 success), B the host bytes the driver holds for it (VMM: the
 *                                            rounded size; pools: cudaMemPoolAttrReservedMemCurrent, page-rounded;
 *                                            graph: the node's size). After each step but the last it waits for a
 *                                            line on stdin (EOF: it goes on); a failed step waits too, then exits 3.
 * PATH: vmm           created (cuMemCreate with a host location, reserve, map, access), released (cuMemRelease,
 *                     still mapped), unmapped
 *       pool          created (cudaMemPoolCreate host, release threshold unbounded, one cudaMallocFromPoolAsync),
 *                     alloc2, freed (the first, cudaFreeAsync + synchronize), trimmed (cudaMemPoolTrimTo 0),
 *                     destroyed (cudaMemPoolDestroy, the second live), gone (the second freed)
 *       default-pool  the same on CUDA 13's default host pool (cudaMemGetDefaultMemPool), ending with done (the
 *                     second freed, trimmed to 0)
 *       graph         created (cudaGraphAddMemAllocNode with a host location), destroyed (cudaGraphDestroy)
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long page_round(unsigned long long b)
{
	return (b + 4095) / 4096 * 4096;
}

/* Print a step and wait for the go-ahead; a failed one then ends the program. */
static void step(const char *name, int rc, unsigned long long bytes, int last)
{
	int c;

	printf("%s rc=%d bytes=%llu\n", name, rc, bytes);
	fflush(stdout);
	if (last && rc == 0)
		return;
	while ((c = getchar()) != EOF && c != '\n')
		;
	if (rc != 0)
		exit(3);
}

template <typename F> static F entry(const char *name)
{
	void *p = NULL;
	cudaDriverEntryPointQueryResult q;

	if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess) {
		fprintf(stderr, "cudapaths_prog: %s: no driver entry point\n", name);
		exit(2);
	}
	return (F)p;
}

static int run_vmm(size_t size)
{
	auto create = entry<decltype(&cuMemCreate)>("cuMemCreate");
	auto release = entry<decltype(&cuMemRelease)>("cuMemRelease");
	auto granularity = entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
	auto reserve = entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
	auto address_free = entry<decltype(&cuMemAddressFree)>("cuMemAddressFree");
	auto map = entry<decltype(&cuMemMap)>("cuMemMap");
	auto unmap = entry<decltype(&cuMemUnmap)>("cuMemUnmap");
	auto set_access = entry<decltype(&cuMemSetAccess)>("cuMemSetAccess");
	CUmemAllocationProp prop;
	CUmemAccessDesc access;
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr va = 0;
	size_t g = 0;
	int rc;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; /* NCCL's choice (ncclCuMemHostAlloc) */
	prop.location.id = 0;
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = 0;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	rc = granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (rc == 0 && g)
		size = (size + g - 1) / g * g;
	if (rc == 0)
		rc = create(&h, size, &prop, 0);
	if (rc == 0)
		rc = reserve(&va, size, g, 0, 0);
	if (rc == 0)
		rc = map(va, size, 0, h, 0);
	if (rc == 0)
		rc = set_access(va, size, &access, 1);
	step("created", rc, size, 0);
	step("released", release(h), size, 0);
	rc = unmap(va, size);
	if (rc == 0)
		rc = address_free(va, size);
	step("unmapped", rc, 0, 1);
	return 0;
}

static unsigned long long reserved(cudaMemPool_t pool)
{
	cuuint64_t v = 0;

	cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v);
	return page_round(v);
}

static int run_pool(size_t size, bool use_default)
{
	cudaMemPoolProps props;
	cudaMemLocation where;
	cudaMemPool_t pool = NULL;
	cudaStream_t st;
	cuuint64_t unbounded = UINT64_MAX;
	void *a = NULL, *b = NULL;
	int rc;

	memset(&props, 0, sizeof(props));
	props.allocType = cudaMemAllocationTypePinned;
	props.location.type = cudaMemLocationTypeHost;
	memset(&where, 0, sizeof(where));
	where.type = cudaMemLocationTypeHost;
	rc = cudaStreamCreate(&st);
	if (rc == 0)
		rc = use_default ? cudaMemGetDefaultMemPool(&pool, &where, cudaMemAllocationTypePinned)
				 : cudaMemPoolCreate(&pool, &props);
	/*
	 * Freed memory stays in the pool until trimmed: what it reserves is then the program's doing alone. Best
	 * effort: a driver that refuses it releases freed memory at the next synchronisation, which the "freed"
	 * step then shows (the interposer reads the pool's figure at the free, before that).
	 */
	if (rc == 0 && cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &unbounded) != cudaSuccess)
		fprintf(stderr, "cudapaths_prog: the pool's release threshold cannot be raised\n");
	if (rc == 0)
		rc = cudaMallocFromPoolAsync(&a, size, pool, st);
	if (rc == 0)
		rc = cudaStreamSynchronize(st);
	step("created", rc, rc ? 0 : reserved(pool), 0);
	rc = cudaMallocFromPoolAsync(&b, size, pool, st);
	if (rc == 0)
		rc = cudaStreamSynchronize(st);
	step("alloc2", rc, reserved(pool), 0);
	rc = cudaFreeAsync(a, st);
	if (rc == 0)
		rc = cudaStreamSynchronize(st);
	step("freed", rc, reserved(pool), 0);
	/*
	 * The trim first, then the figure: as two arguments of one call their order is unspecified, and on the
	 * H100 host the figure was read before the trim (512 MiB where the driver then held 256).
	 */
	rc = cudaMemPoolTrimTo(pool, 0);
	step("trimmed", rc, reserved(pool), 0);
	if (use_default) {
		rc = cudaFreeAsync(b, st);
		if (rc == 0)
			rc = cudaStreamSynchronize(st);
		if (rc == 0)
			rc = cudaMemPoolTrimTo(pool, 0);
		step("done", rc, reserved(pool), 1);
		return 0;
	}
	unsigned long long before = reserved(pool);
	step("destroyed", cudaMemPoolDestroy(pool), before, 0);
	rc = cudaFreeAsync(b, st);
	if (rc == 0)
		rc = cudaStreamSynchronize(st);
	step("gone", rc, 0, 1);
	return 0;
}

static int run_graph(size_t size)
{
	cudaMemAllocNodeParams p;
	cudaGraph_t g = NULL;
	cudaGraphNode_t n = NULL;
	int rc;

	memset(&p, 0, sizeof(p));
	p.poolProps.allocType = cudaMemAllocationTypePinned;
	p.poolProps.location.type = cudaMemLocationTypeHost;
	p.bytesize = size;
	rc = cudaGraphCreate(&g, 0);
	if (rc == 0)
		rc = cudaGraphAddMemAllocNode(&n, g, NULL, 0, &p);
	step("created", rc, page_round(size), 0);
	step("destroyed", cudaGraphDestroy(g), 0, 1);
	return 0;
}

int main(int argc, char **argv)
{
	cudaDeviceProp prop;
	int n = 0;
	size_t size;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("cudapaths_prog: no GPU\n");
		return 77;
	}
	if (argc >= 2 && strcmp(argv[1], "probe") == 0) {
		cudaGetDeviceProperties(&prop, 0);
		printf("GPU: %s\n", prop.name);
		return 0;
	}
	if (argc < 3) {
		fprintf(stderr, "usage: cudapaths_prog probe | vmm|pool|default-pool|graph SIZE\n");
		return 2;
	}
	size = strtoull(argv[2], NULL, 0);
	cudaSetDevice(0);
	cudaFree(0); /* the context first: its own pinned memory is not what is measured */
	if (strcmp(argv[1], "vmm") == 0)
		return run_vmm(size);
	if (strcmp(argv[1], "pool") == 0 || strcmp(argv[1], "default-pool") == 0)
		return run_pool(size, strcmp(argv[1], "default-pool") == 0);
	if (strcmp(argv[1], "graph") == 0)
		return run_graph(size);
	fprintf(stderr, "cudapaths_prog: unknown path %s\n", argv[1]);
	return 2;
}
