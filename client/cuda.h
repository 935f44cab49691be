/* SPDX-License-Identifier: MIT */
/* libpinbroker's run-time binding to the CUDA driver (dlopen of libcuda.so.1): internal, never exported. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/*
 * Load and initialise the driver once per process. Returns 1 when memory can
 * be registered here, else 0 with *reason (static text, may be NULL) saying
 * why: no driver, cuInit failed, no devices, or PINBROKER_NO_CUDA=1.
 */
int pbcuda_available(const char **reason);

/*
 * cuMemHostRegister(PORTABLE, plus DEVICEMAP when mapped) the range
 * [p, p + bytes), so cuMemHostGetDevicePointer works on it. Works whether or not
 * the calling thread has a current context (it borrows device 0's primary
 * context otherwise). Returns 0 or a negative errno; pbcuda_strerror() then
 * says what the driver answered.
 */
int pbcuda_register(void *p, size_t bytes, bool mapped);

/* Undo pbcuda_register(p, ...). Failures are ignored: the range is unmapped next anyway. */
void pbcuda_unregister(void *p);

/* 1 when the driver knows p as registered host memory, 0 otherwise (for tests and diagnostics). */
int pbcuda_is_registered(const void *p);

/*
 * The PCI bus id ("0000:3b:00.0") of the calling thread's current CUDA device
 * (gpu NULL), or of a GPU named by CUDA ordinal ("0") or UUID ("GPU-..."), in
 * buf. Returns 0, or -ENODEV (no driver, no context, no such GPU).
 */
int pbcuda_bus_id(const char *gpu, char *buf, size_t len);

/*
 * The host NUMA node the driver reports for a GPU (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, CUDA 12.2+): gpu as
 * pbcuda_bus_id takes it, or a PCI bus id. Returns the node, or -1 when the driver cannot say (no driver,
 * no such GPU, a driver without the attribute, or a system without NUMA).
 */
int pbcuda_host_numa_node(const char *gpu);

/* The calling thread's message for its last failed pbcuda_register(). Never NULL. */
const char *pbcuda_strerror(void);
