/* SPDX-License-Identifier: MIT */
/* libpinbroker's view of the GPU: its NUMA node (driver, else sysfs), for placing leases, and CUDA's presence. */
#define _GNU_SOURCE
#include "lib-int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"

/*
 * A GPU's node from <PINBROKER_SYS_ROOT>/sys/bus/pci/devices/BUS/numa_node (the domain added when
 * missing, lower case, as sysfs names devices); -1 when it cannot tell.
 */
static int bus_node(const char *bus)
{
	const char *root = getenv("PINBROKER_SYS_ROOT");
	char name[32], path[4200], line[32];
	size_t n = 0;
	FILE *f;
	int node = -1;

	if (!strchr(bus, ':') || strlen(bus) > 20)
		return -1;
	/* "3b:00.0" has one colon; "0000:3b:00.0" two. */
	if (strchr(bus, ':') == strrchr(bus, ':'))
		n = (size_t)snprintf(name, sizeof(name), "0000:");
	for (const char *c = bus; *c && n + 1 < sizeof(name); c++)
		name[n++] = (char)tolower((unsigned char)*c);
	name[n] = 0;
	snprintf(path, sizeof(path), "%s/sys/bus/pci/devices/%s/numa_node", root ? root : "", name);
	f = fopen(path, "re");
	if (f) {
		if (fgets(line, sizeof(line), f))
			node = atoi(line);
		fclose(f);
	}
	return node >= 0 ? node : -1;
}

/*
 * A GPU's node: the driver's CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID first (the only source on hosts whose
 * firmware leaves sysfs numa_node at -1, as the H200 test VM does), then sysfs through its PCI bus id.
 */
int pb_gpu_numa_node(const char *gpu)
{
	char bus[64];
	int node;

	if (!gpu || !*gpu)
		return -1;
	node = pbcuda_host_numa_node(gpu);
	if (node >= 0)
		return node;
	if (strchr(gpu, ':'))
		return bus_node(gpu);
	return pbcuda_bus_id(gpu, bus, sizeof(bus)) == 0 ? bus_node(bus) : -1;
}

/* The node an acquire asks for (PB_ACQUIRE_NUMA_NODE, _GPU, _ANY_NODE, else the current CUDA device's), or -1. */
int gpu_acquire_node(const struct pb_acquire_opts *opts)
{
	static __thread char last_bus[64];
	static __thread int last_node = -1;
	uint32_t flags = opts ? opts->flags : 0;
	char bus[64];

	if (flags & PB_ACQUIRE_ANY_NODE)
		return -1;
	if (flags & PB_ACQUIRE_NUMA_NODE)
		return opts->numa_node >= 0 ? opts->numa_node : -1;
	if (flags & PB_ACQUIRE_GPU)
		return pb_gpu_numa_node(opts->gpu);
	/* No CUDA asked for, or none here: no preference (and no driver loaded for it). */
	if ((flags & PB_ACQUIRE_NO_CUDA) || pbcuda_bus_id(NULL, bus, sizeof(bus)) < 0)
		return -1;
	/* Resolved once per device a thread switches to: the driver's answer, else sysfs's. */
	if (strcmp(bus, last_bus) != 0) {
		snprintf(last_bus, sizeof(last_bus), "%s", bus);
		last_node = pbcuda_host_numa_node(NULL);
		if (last_node < 0)
			last_node = bus_node(bus);
	}
	return last_node;
}

int pb_cuda_available(const char **reason)
{
	return pbcuda_available(reason);
}
