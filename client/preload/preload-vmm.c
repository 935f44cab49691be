/* SPDX-License-Identifier: MIT */
/*
 * libpinbroker-preload.so's hooks for VMM allocations with a host location (cuMemCreate, then cuMemMap), memory the
 * CUDA driver allocates and owns itself, so no lease can serve it.
 *
 * A VMM handle is charged, as a registration against the budget (charge only: the pages stay the driver's), by its
 * page-rounded size, from cuMemCreate until the driver frees the memory, which is when the last reference goes: the
 * handle released (cuMemRelease, once per cuMemCreate or cuMemRetainAllocationHandle) and every mapping of it
 * unmapped (cuMemUnmap). The common "map, then release the handle" idiom stays charged while mapped. When the broker
 * refuses (or is absent), PINBROKER_PRELOAD_FALLBACK decides (preload-cudapaths.c). Device VMM (PyTorch's
 * expandable segments) goes through these hooks too: pbp_vmm.host_vmms and pbp_vmm.maps_span let it call through
 * without the lock.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "pinbroker.h"
#include "preload-cudapaths-int.h"
#include "preload-filter.h"
#include "preload-table.h"
#include "preload.h"

/* A VMM allocation with a host location: alive while the program holds a handle to it or a mapping of it. */
struct vmm {
	CUmemGenericAllocationHandle handle;
	size_t bytes;     /* page-rounded */
	pb_lease *charge; /* NULL: unbrokered */
	int refs;         /* cuMemCreate, plus each cuMemRetainAllocationHandle, less each cuMemRelease */
	int maps;         /* live cuMemMap mappings */
};

/* Whether h may be a host VMM allocation's handle (in pbp_vmm.handles); false means it is not. */
static bool vmm_may_be_host(CUmemGenericAllocationHandle h)
{
	return h == 0 || pbp_slots_may_hold(&pbp_vmm.host_vmms, (void *)(uintptr_t)h);
}

/* Know v by handle h, in pbp_vmm.handles and pbp_vmm.host_vmms. Under the lock. */
static int vmm_put_handle(struct vmm *v, CUmemGenericAllocationHandle h)
{
	int r = pbp_table_put(&pbp_vmm.handles,
			      &(struct pbp_entry){ .base = (uintptr_t)h, .bytes = 1, .kind = PBP_LEASE, .lease = v });

	if (r == 0 && h)
		pbp_slots_add(&pbp_vmm.host_vmms, (void *)(uintptr_t)h);
	return r;
}

/* Drop what v holds when its last reference went: the charge or the unbrokered report. Under the lock. */
static void vmm_maybe_free(struct vmm *v)
{
	if (v->refs > 0 || v->maps > 0)
		return;
	if (v->charge)
		pbp_uncharge(v->charge);
	else
		pbp_unbrokered_adjust(0, v->bytes);
	pbp_say(false, "cuMemCreate handle %llu: %zu host bytes freed", v->handle, v->bytes);
	free(v);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const struct cu_alloc_prop *prop,
			    unsigned long long flags)
{
	typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, size_t, const struct cu_alloc_prop *,
				 unsigned long long);
	size_t bytes = pbp_cudapaths_round_page(size);
	pb_lease *charge = NULL;
	struct vmm *v;
	char why[256];
	CUresult r;

	if (!pbp_real_fn(F_cuMemCreate))
		return CU_NOT_INITIALIZED;
	if (pbp_passthrough() || !handle || size == 0 || !prop || !pbp_cudapaths_host_location(&prop->location))
		return CALL(fn_t, F_cuMemCreate, handle, size, prop, flags);
	if (!(v = calloc(1, sizeof(*v))))
		return CU_OUT_OF_MEMORY;
	pbp_cudapaths_lock();
	if (pbp_charge(bytes, &charge, why, sizeof(why)) < 0) {
		if (pbp_cudapaths_refuse()) {
			pbp_cudapaths_unlock();
			free(v);
			pbp_say(true,
				"cuMemCreate of %zu host bytes refused (%s): out-of-memory error (fallback=error)",
				size, why);
			return CU_OUT_OF_MEMORY;
		}
		pbp_say(true,
			"cuMemCreate of %zu host bytes: %s: pinned by the CUDA driver, outside the budget "
			"(reported as unbrokered)",
			size, why);
	}
	pbp_enter();
	r = CALL(fn_t, F_cuMemCreate, handle, size, prop, flags);
	pbp_leave();
	if (r != CU_OK) {
		pbp_uncharge(charge);
		pbp_cudapaths_unlock();
		free(v);
		return r;
	}
	*v = (struct vmm){ .handle = *handle, .bytes = bytes, .charge = charge, .refs = 1 };
	if (vmm_put_handle(v, *handle) < 0) {
		/* Untracked, it would stay charged for ever: give the memory back instead. */
		pbp_enter();
		CALL(CUresult(*)(CUmemGenericAllocationHandle), F_cuMemRelease, *handle);
		pbp_leave();
		pbp_uncharge(charge);
		pbp_cudapaths_unlock();
		free(v);
		return CU_OUT_OF_MEMORY;
	}
	if (!charge)
		pbp_unbrokered_adjust(bytes, 0);
	pbp_cudapaths_unlock();
	pbp_say(false, "cuMemCreate: %zu host bytes %s", bytes, charge ? "charged as a registration" : "unbrokered");
	return CU_OK;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	const struct pbp_entry *e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemRelease))
		return CU_NOT_INITIALIZED;
	/* Locked across the driver's call too: see cuMemMap. A device handle calls through (see pbp_vmm.host_vmms). */
	if ((track = !pbp_passthrough() && vmm_may_be_host(handle)))
		pbp_cudapaths_lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUmemGenericAllocationHandle), F_cuMemRelease, handle);
	pbp_leave();
	if (!track)
		return r;
	e = r == CU_OK ? pbp_table_find(&pbp_vmm.handles, (uintptr_t)handle) : NULL;
	if (e && e->base == (uintptr_t)handle) {
		struct vmm *v = e->lease;

		/* Still retained: the handle stays known, in the set all along (a reader must never miss it). */
		if (--v->refs == 0) {
			pbp_table_take(&pbp_vmm.handles, (uintptr_t)handle, true, &(struct pbp_entry){ 0 });
			if (handle)
				pbp_slots_remove(&pbp_vmm.host_vmms, (void *)(uintptr_t)handle);
		}
		vmm_maybe_free(v);
	}
	pbp_cudapaths_unlock();
	return r;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	const struct pbp_entry *e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemRetainAllocationHandle))
		return CU_NOT_INITIALIZED;
	/* Locked across the driver's call too (see cuMemMap): an unmap in between would free the record. */
	if ((track = !pbp_passthrough() && handle && pbp_span_may_hold(&pbp_vmm.maps_span, (uintptr_t)addr)))
		pbp_cudapaths_lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUmemGenericAllocationHandle *, void *), F_cuMemRetainAllocationHandle, handle, addr);
	pbp_leave();
	if (!track)
		return r;
	if (r == CU_OK && (e = pbp_table_find(&pbp_vmm.mappings, (uintptr_t)addr))) {
		struct vmm *v = e->lease;

		/* Released while mapped, it is known again by the handle the driver gave now. */
		if (v->refs++ == 0) {
			v->handle = *handle;
			vmm_put_handle(v, *handle);
		}
	}
	pbp_cudapaths_unlock();
	return r;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			 unsigned long long flags)
{
	const struct pbp_entry *e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemMap))
		return CU_NOT_INITIALIZED;
	/*
	 * Locked before the driver's call, not after: a cuMemRelease on another thread in between would see no
	 * mapping, free the record and give the charge back, and this mapping would then find no handle: pinned
	 * by the driver, charged to no one (cuMemUnmap and cuMemRelease lock the same way). A device handle calls
	 * through (see pbp_vmm.host_vmms).
	 */
	if ((track = !pbp_passthrough() && vmm_may_be_host(handle)))
		pbp_cudapaths_lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long), F_cuMemMap,
		 ptr, size, offset, handle, flags);
	pbp_leave();
	if (!track)
		return r;
	e = r == CU_OK ? pbp_table_find(&pbp_vmm.handles, (uintptr_t)handle) : NULL;
	if (e && e->base == (uintptr_t)handle &&
	    pbp_table_put(&pbp_vmm.mappings, &(struct pbp_entry){ .base = (uintptr_t)ptr,
								  .bytes = size ? size : 1,
								  .kind = PBP_LEASE,
								  .lease = e->lease }) == 0) {
		((struct vmm *)e->lease)->maps++;
		pbp_cudapaths_span_set(&pbp_vmm.maps_span, &pbp_vmm.mappings);
	}
	pbp_cudapaths_unlock();
	return r;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	struct pbp_entry e;
	bool track;
	CUresult r;

	if (!pbp_real_fn(F_cuMemUnmap))
		return CU_NOT_INITIALIZED;
	/* Locked across the driver's call too: see cuMemMap. A range away from every host mapping: no lock. */
	if ((track = !pbp_passthrough() && pbp_span_may_meet(&pbp_vmm.maps_span, (uintptr_t)ptr, size)))
		pbp_cudapaths_lock();
	pbp_enter();
	r = CALL(CUresult(*)(CUdeviceptr, size_t), F_cuMemUnmap, ptr, size);
	pbp_leave();
	if (!track)
		return r;
	/* Every mapping that starts inside the range is gone (the driver unmaps whole mappings only). */
	for (size_t i = 0; r == CU_OK && i < pbp_vmm.mappings.n;) {
		if (pbp_vmm.mappings.v[i].base >= (uintptr_t)ptr &&
		    pbp_vmm.mappings.v[i].base - (uintptr_t)ptr < size &&
		    pbp_table_take(&pbp_vmm.mappings, pbp_vmm.mappings.v[i].base, true, &e)) {
			struct vmm *v = e.lease;

			v->maps--;
			vmm_maybe_free(v);
			continue;
		}
		i++;
	}
	pbp_cudapaths_span_set(&pbp_vmm.maps_span, &pbp_vmm.mappings);
	pbp_cudapaths_unlock();
	return r;
}
