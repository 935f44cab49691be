// SPDX-License-Identifier: MIT
// torch's CUDA host allocator (pin_memory=True, Tensor.pin_memory(), the DataLoader pin thread) backed by
// pinbrokerd: each block is one exact-size lease, freed once the CUDA work recorded on it has completed.
//
// Built by pinbroker/torch_alloc.py with torch.utils.cpp_extension.load (torch >= 2.8: at::HostAllocator and
// at::setHostAllocator are in ATen/core/CachingHostAllocator.h). libpinbroker is not linked: its functions are
// looked up with dlopen/dlsym in the file Python's pinbroker._lib loaded, so this module and the ctypes
// binding share one copy of the library. client/lib/pinbroker.h only declares the prototypes (decltype below).
//
// What it does, against torch's CachingHostAllocator:
// - allocate(n) leases exactly n bytes (the library rounds to the page) with PB_ACQUIRE_NO_REVOKE (torch
//   cannot give a tensor's memory back on request) and PB_ACQUIRE_MAPPED (DEVICEMAP, as cudaHostAlloc
//   memory is), and PB_ACQUIRE_INHERIT (a forked child has it, as it has cudaHostAlloc's). Stock torch rounds to a power of two: 2.08 GiB took 4 GiB on the H200 (GPU.md, 2026-12-03).
// - A refused lease (any negative errno), one CUDA did not register, a call from a forked child, and any
//   call while a CUDA graph capture is under way go to the allocator that was installed before (torch's
//   CachingHostAllocator), counted as fallbacks. record_event for memory that is not ours goes there too.
// - An exact-size cache of free blocks: a freed block goes to pb_release as soon as every event recorded on
//   it has completed, and the allocator's connection keeps it in libpinbroker's client cache (pb_set_cache_limit,
//   slack 0 by default: only a request of the same page-rounded size takes it back), still mapped, registered
//   and counted by the daemon, which is told it is idle once it sat ~100 ms and revokes it first under
//   pressure (the library then gives it back itself). A re-allocation of that size costs no round trip.
//   empty_cache() empties it; the cap bounds it (the oldest cached blocks go back first).
//   Why the library's cache, not one here: it already owns the revoke path for cached leases (the receiver
//   thread gives them back without a callback), the idle reporting and the reconnect rules.
// - Pending frees are polled (cudaEventQuery, through at::cuda::CUDAEvent as torch's allocator does) on
//   every allocate and free and in empty_cache().
// - Fallbacks are counted: what torch's own allocator holds pinned (its HostStats) is reported to the daemon
//   as unbrokered memory after each fallback and each empty_cache(), unless the interposer runs in this
//   process (it counts torch's cudaHostAlloc calls itself).

#include <torch/extension.h>

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pinbroker.h"

namespace {

// The libpinbroker functions used here, typed by the header's prototypes and resolved at run time.
struct PbApi {
	decltype(&pb_connect) connect = nullptr;
	decltype(&pb_acquire) acquire = nullptr;
	decltype(&pb_release) release = nullptr;
	decltype(&pb_lease_data) lease_data = nullptr;
	decltype(&pb_lease_size) lease_size = nullptr;
	decltype(&pb_lease_cuda_registered) lease_cuda_registered = nullptr;
	decltype(&pb_last_error) last_error = nullptr;
	decltype(&pb_strerror) strerror_ = nullptr;
	decltype(&pb_set_cache_limit) set_cache_limit = nullptr;
	decltype(&pb_set_cache_slack) set_cache_slack = nullptr;
	decltype(&pb_cache_stats) cache_stats = nullptr;
	decltype(&pb_report_unbrokered) report_unbrokered = nullptr;
};

// Resolve every function of PbApi in the library at path; throws with dlerror()'s words.
PbApi load_api(const std::string &path)
{
	// RTLD_NOLOAD first: ctypes has it loaded already, and that copy (its connections, its CUDA state) is
	// the one to share. dlopen of the same file returns the same handle anyway; NOLOAD only says so.
	void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen(path.c_str(), RTLD_NOW);
	TORCH_CHECK(h, "pinbroker host allocator: cannot dlopen ", path, ": ", dlerror());
	PbApi api;
	auto sym = [&](auto &fn, const char *name) {
		void *p = dlsym(h, name);
		TORCH_CHECK(p, "pinbroker host allocator: ", path, " lacks ", name, " (not libpinbroker, or too old)");
		fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
	};
	sym(api.connect, "pb_connect");
	sym(api.acquire, "pb_acquire");
	sym(api.release, "pb_release");
	sym(api.lease_data, "pb_lease_data");
	sym(api.lease_size, "pb_lease_size");
	sym(api.lease_cuda_registered, "pb_lease_cuda_registered");
	sym(api.last_error, "pb_last_error");
	sym(api.strerror_, "pb_strerror");
	sym(api.set_cache_limit, "pb_set_cache_limit");
	sym(api.set_cache_slack, "pb_set_cache_slack");
	sym(api.cache_stats, "pb_cache_stats");
	sym(api.report_unbrokered, "pb_report_unbrokered");
	return api;
}

// One allocation: one lease. The DataPtr's context points here.
struct Block {
	void *ptr = nullptr;
	size_t size_bytes = 0;   // what torch asked for
	size_t leased_bytes = 0; // pb_lease_size: page-rounded
	pb_lease *lease = nullptr;
	bool allocated = true;            // false once torch freed it
	size_t events_pending = 0;        // events recorded at free time, not yet completed
	std::vector<c10::Stream> streams; // streams record_event named while allocated
};

int64_t now_us()
{
	return std::chrono::duration_cast<std::chrono::microseconds>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

void host_delete(void *ctx);

// ---- at::HostStats changed between torch releases: 2.8 has allocation / segment / allocated_bytes (active) /
// reserved_bytes; 2.11 has active_requests / active_bytes / allocations / allocated_bytes (free + used). The
// fields are filled where they exist, each with its version's meaning.

struct Counters {
	c10::CachingAllocator::Stat active;       // blocks torch holds
	c10::CachingAllocator::Stat active_bytes; // the bytes torch asked for, of those
	c10::CachingAllocator::Stat held;         // blocks leased: torch's, and freed ones whose events are pending
	c10::CachingAllocator::Stat leased_bytes; // pb_lease_size of those (page-rounded)
	c10::CachingAllocator::DurationStat acquire_time_us;
	c10::CachingAllocator::DurationStat release_time_us;

	void reset_accumulated()
	{
		active.reset_accumulated();
		active_bytes.reset_accumulated();
		held.reset_accumulated();
		leased_bytes.reset_accumulated();
		acquire_time_us.reset_accumulated();
		release_time_us.reset_accumulated();
	}
	void reset_peak()
	{
		active.reset_peak();
		active_bytes.reset_peak();
		held.reset_peak();
		leased_bytes.reset_peak();
		acquire_time_us.reset_peak();
		release_time_us.reset_peak();
	}
};

#define PB_HAS_FIELD(name)                                                                                          \
	template <class S, class = void> struct has_##name : std::false_type {                                      \
	};                                                                                                          \
	template <class S> struct has_##name<S, std::void_t<decltype(std::declval<S &>().name)>> : std::true_type { \
	};
PB_HAS_FIELD(allocation)
PB_HAS_FIELD(segment)
PB_HAS_FIELD(reserved_bytes)
PB_HAS_FIELD(active_requests)
PB_HAS_FIELD(active_bytes)
PB_HAS_FIELD(allocations)
PB_HAS_FIELD(host_alloc_time)
PB_HAS_FIELD(host_free_time)
PB_HAS_FIELD(num_host_alloc)
PB_HAS_FIELD(num_host_free)
#undef PB_HAS_FIELD

template <class S> void fill_host_stats(S &s, const Counters &c)
{
	if constexpr (has_active_bytes<S>::value) {
		s.active_bytes = c.active_bytes;
		s.allocated_bytes = c.leased_bytes; // 2.11: "accounts for both free and in-use blocks"
	} else {
		s.allocated_bytes = c.active_bytes; // 2.8: bytes of the allocations torch holds
	}
	if constexpr (has_active_requests<S>::value)
		s.active_requests = c.active;
	if constexpr (has_allocations<S>::value)
		s.allocations = c.held;
	if constexpr (has_allocation<S>::value)
		s.allocation = c.active;
	if constexpr (has_segment<S>::value)
		s.segment = c.held; // one lease per allocation: no splitting, no cache
	if constexpr (has_reserved_bytes<S>::value)
		s.reserved_bytes = c.leased_bytes;
	if constexpr (has_host_alloc_time<S>::value)
		s.host_alloc_time = c.acquire_time_us;
	if constexpr (has_host_free_time<S>::value)
		s.host_free_time = c.release_time_us;
	if constexpr (has_num_host_alloc<S>::value)
		s.num_host_alloc = c.held.allocated;
	if constexpr (has_num_host_free<S>::value)
		s.num_host_free = c.held.freed;
}

// What torch's own allocator holds pinned, used and cached: 2.11's allocated_bytes ("free and in-use
// blocks"), 2.8's reserved_bytes.
template <class S> int64_t torch_pinned_bytes(const S &s)
{
	if constexpr (has_active_bytes<S>::value)
		return s.allocated_bytes.current;
	else if constexpr (has_reserved_bytes<S>::value)
		return s.reserved_bytes.current;
	else
		return 0;
}

// Whether pinbroker's interposer (libpinbroker-preload.so) is loaded here: then it sees torch's own
// cudaHostAlloc calls and counts them, and reporting them too would count them twice.
bool interposer_loaded()
{
	int found = 0;
	dl_iterate_phdr(
		[](struct dl_phdr_info *info, size_t, void *data) {
			if (info->dlpi_name && std::strstr(info->dlpi_name, "libpinbroker-preload"))
				*static_cast<int *>(data) = 1;
			return *static_cast<int *>(data);
		},
		&found);
	return found != 0;
}

// Set in a child forked after install: its memory calls go to torch's allocator, never to the parent's
// connection. A fork handler rather than getpid() on every call: getpid is a system call, and the steady
// state of an alloc/free pair is a few microseconds.
std::atomic<bool> g_forked{false};

bool in_child()
{
	return g_forked.load(std::memory_order_relaxed);
}

struct PinbrokerHostAllocatorBase : public at::HostAllocator {
	at::HostAllocator *prev_ = nullptr; // torch's allocator, captured before installing
	std::atomic<int> captures_{0};      // CUDA graph captures under way (begin/end_allocate_to_pool)
};

// ---- CUDA graph host pools: forwarded to the previous allocator where this torch has them.
//
// Newer torch calls at::getHostAllocator(kCUDA)->begin_allocate_to_pool() at every graph capture, and
// HostAllocator's default throws "Not implemented". Whether the hooks exist (and their parameter types) is
// read from the header through templates, so this file builds against torch with and without them.

template <class M> struct member_args;
template <class C, class R, class... A> struct member_args<R (C::*)(A...)> {
	template <size_t I> using at = std::tuple_element_t<I, std::tuple<A...>>;
};

template <class B, class = void> struct WithBeginPool : B {
};
template <class B> struct WithBeginPool<B, std::void_t<decltype(&B::begin_allocate_to_pool)>> : B {
	using Args = member_args<decltype(&B::begin_allocate_to_pool)>;
	void begin_allocate_to_pool(typename Args::template at<0> id, typename Args::template at<1> filter) override
	{
		// Allocations during the capture go to torch's allocator, which keeps them in the graph's pool.
		this->captures_++;
		this->prev_->begin_allocate_to_pool(id, std::move(filter));
	}
};

template <class B, class = void> struct WithEndPool : B {
};
template <class B> struct WithEndPool<B, std::void_t<decltype(&B::end_allocate_to_pool)>> : B {
	using Args = member_args<decltype(&B::end_allocate_to_pool)>;
	void end_allocate_to_pool(typename Args::template at<0> id) override
	{
		this->prev_->end_allocate_to_pool(id);
		if (this->captures_ > 0)
			this->captures_--;
	}
};

template <class B, class = void> struct WithReleasePool : B {
};
template <class B> struct WithReleasePool<B, std::void_t<decltype(&B::release_pool)>> : B {
	using Args = member_args<decltype(&B::release_pool)>;
	void release_pool(typename Args::template at<0> id) override
	{
		this->prev_->release_pool(id);
	}
};

template <class B, class = void> struct WithIncrefPool : B {
};
template <class B> struct WithIncrefPool<B, std::void_t<decltype(&B::create_or_incref_pool)>> : B {
	using Args = member_args<decltype(&B::create_or_incref_pool)>;
	void create_or_incref_pool(typename Args::template at<0> id) override
	{
		this->prev_->create_or_incref_pool(id);
	}
};

using PoolHooks = WithIncrefPool<WithReleasePool<WithEndPool<WithBeginPool<PinbrokerHostAllocatorBase>>>>;

class PinbrokerHostAllocator final : public PoolHooks {
public:
	PinbrokerHostAllocator(PbApi api, pb_client *client, std::string label, uint8_t priority)
	    : api_(api), client_(client), label_(std::move(label)), priority_(priority),
	      report_fallbacks_(!interposer_loaded())
	{
	}

	// The cache of freed blocks: at most cap bytes, a request served by a block at most slack_pct larger.
	void set_cache(size_t cap, unsigned slack_pct)
	{
		cache_cap_ = cap;
		api_.set_cache_slack(client_, slack_pct);
		api_.set_cache_limit(client_, cap);
	}

	// ---- at::Allocator

	at::DataPtr allocate(size_t n) override
	{
		if (n == 0)
			return {nullptr, nullptr, &host_delete, at::Device(at::DeviceType::CPU)};
		process_events();
		const char *why = nullptr;
		std::string reason;
		if (in_child())
			return prev_->allocate(n); // the connection is the parent's: never send on it, nor lock mu_
		if (captures_ > 0) {
			why = "CUDA graph capture";
		} else {
			pb_acquire_opts opts{};
			opts.flags = PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED | PB_ACQUIRE_INHERIT;
			opts.priority = PB_PRIORITY_NORMAL;
			opts.label = label_.c_str();
			pb_lease *l = nullptr;
			int64_t t0 = now_us();
			int r = api_.acquire(client_, n, &opts, &l);
			if (r < 0 && refusal_may_be_ours(r)) {
				// Our own cached blocks count against this uid's quota and never-revoked share, and the
				// daemon reclaims only other clients' idle leases: give ours back and ask once more.
				api_.set_cache_limit(client_, 0);
				api_.set_cache_limit(client_, cache_cap_);
				r = api_.acquire(client_, n, &opts, &l);
			}
			int64_t t1 = now_us();
			if (r < 0) {
				why = "refused";
				reason = std::string(api_.last_error());
			} else if (!api_.lease_cuda_registered(l)) {
				why = "not CUDA-registered";
				reason = "the lease is not registered with CUDA here";
				api_.release(client_, l);
			} else {
				return adopt(l, n, t1 - t0);
			}
		}
		note_fallback(n, why, reason);
		at::DataPtr p = prev_->allocate(n);
		report_torch_pinned();
		return p;
	}

	void copy_data(void *dest, const void *src, std::size_t count) const override
	{
		std::memcpy(dest, src, count);
	}

	// ---- at::HostAllocator

	bool record_event(void *ptr, void *ctx, c10::Stream stream) override
	{
		{
			std::lock_guard<std::mutex> g(mu_);
			Block *b = find_locked(ptr, ctx);
			if (b) {
				bool seen = false;
				for (auto &s : b->streams)
					seen = seen || s == stream;
				if (!seen)
					b->streams.push_back(stream);
				events_recorded_++;
				return true;
			}
		}
		// Memory of torch's own allocator: fallbacks, and tensors pinned before install().
		return prev_->record_event(ptr, ctx, stream);
	}

	// Give back every freed block whose events completed, then empty torch's cache (fallbacks, and blocks
	// from before install): torch._C._host_emptyCache() reaches only the installed allocator.
	void empty_cache() override
	{
		process_events();
		if (!in_child()) {
			api_.set_cache_limit(client_, 0); // gives every cached block back to the daemon
			api_.set_cache_limit(client_, cache_cap_);
		}
		prev_->empty_cache();
		report_torch_pinned();
	}

	at::HostStats get_stats() override
	{
		// Cached blocks are free blocks torch's own stats would count as held ("free and in-use").
		struct pb_cache_stats cs {};
		api_.cache_stats(client_, &cs);
		std::lock_guard<std::mutex> g(mu_);
		Counters c = c_;
		c.held.current += static_cast<int64_t>(cs.cached_leases);
		c.leased_bytes.current += static_cast<int64_t>(cs.cached_bytes);
		at::HostStats s;
		fill_host_stats(s, c);
		return s;
	}

	void reset_accumulated_stats() override
	{
		std::lock_guard<std::mutex> g(mu_);
		c_.reset_accumulated();
	}

	void reset_peak_stats() override
	{
		std::lock_guard<std::mutex> g(mu_);
		c_.reset_peak();
	}

	// ---- the deleter's side

	void free(void *ctx)
	{
		auto *b = static_cast<Block *>(ctx);
		if (in_child()) {
			// A forked child's copy of a parent's tensor: the parent holds the lease and its connection.
			return;
		}
		std::vector<c10::Stream> streams;
		{
			std::lock_guard<std::mutex> g(mu_);
			b->allocated = false;
			streams.swap(b->streams);
			c_.active.decrease(1);
			c_.active_bytes.decrease(b->size_bytes);
		}
		if (uninstalled_) {
			// Copies issued since uninstall() were reported to torch's allocator, not here: wait for the
			// devices to go idle instead of trusting the events alone.
			sync_devices();
		}
		std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events;
		for (auto &s : streams) {
			try {
				auto ev = std::make_unique<at::cuda::CUDAEvent>(cudaEventDisableTiming);
				ev->record(at::cuda::CUDAStream(s));
				events.push_back(std::move(ev));
			} catch (const std::exception &e) {
				// No event: the copy cannot be waited for; synchronise its stream instead.
				note_cuda_error(e.what());
				try {
					at::cuda::CUDAStream(s).synchronize();
				} catch (const std::exception &e2) {
					note_cuda_error(e2.what());
				}
			}
		}
		if (events.empty()) {
			give_back(b);
		} else {
			std::lock_guard<std::mutex> g(mu_);
			b->events_pending += events.size();
			for (auto &ev : events)
				events_.emplace_back(std::move(ev), b);
		}
		process_events();
	}

	// ---- Python's view

	py::dict stats_dict()
	{
		std::lock_guard<std::mutex> g(mu_);
		py::dict d;
		d["installed"] = py::bool_(!uninstalled_);
		d["allocations"] = py::int_(c_.active.allocated);
		d["live_blocks"] = py::int_(c_.active.current);
		d["allocated_bytes"] = py::int_(c_.active_bytes.current);
		d["leased_bytes"] = py::int_(c_.leased_bytes.current);
		d["peak_allocated_bytes"] = py::int_(c_.active_bytes.peak);
		d["peak_leased_bytes"] = py::int_(c_.leased_bytes.peak);
		d["blocks_waiting"] = py::int_(blocks_waiting_locked());
		d["events_pending"] = py::int_(events_.size());
		d["events_recorded"] = py::int_(events_recorded_);
		d["released"] = py::int_(released_);
		d["release_errors"] = py::int_(release_errors_);
		d["fallbacks"] = py::int_(fallbacks_);
		d["fallback_bytes"] = py::int_(fallback_bytes_);
		py::dict reasons;
		for (auto &kv : fallback_reasons_)
			reasons[py::str(kv.first)] = py::int_(kv.second);
		d["fallback_reasons"] = reasons;
		d["last_fallback"] = py::str(last_fallback_);
		d["cuda_errors"] = py::int_(cuda_errors_);
		d["last_cuda_error"] = py::str(last_cuda_error_);
		d["acquire_us_total"] = py::int_(c_.acquire_time_us.total);
		d["release_us_total"] = py::int_(c_.release_time_us.total);
		d["label"] = py::str(label_);
		d["priority"] = py::int_(priority_);
		d["unbrokered_reported_bytes"] = py::int_(reported_unbrokered_);
		d["unbrokered_reports"] = py::bool_(report_fallbacks_);
		struct pb_cache_stats cs {};
		if (api_.cache_stats(client_, &cs) == 0) {
			d["cache_cap_bytes"] = py::int_(cs.limit_bytes);
			d["cache_slack_pct"] = py::int_(cs.slack_pct);
			d["cached_bytes"] = py::int_(cs.cached_bytes);
			d["cached_blocks"] = py::int_(cs.cached_leases);
			d["cache_hits"] = py::int_(cs.hits);
			d["cache_misses"] = py::int_(cs.misses);
			d["cache_kept"] = py::int_(cs.kept);
			d["cache_evicted"] = py::int_(cs.evicted);
			d["cache_revoked"] = py::int_(cs.revoked);
		}
		return d;
	}

	void set_installed(bool on)
	{
		uninstalled_ = !on;
	}
	bool installed() const
	{
		return !uninstalled_;
	}
	uint8_t priority() const
	{
		return priority_;
	}
	void set_priority(uint8_t p)
	{
		priority_ = p;
	}
	at::HostAllocator *prev() const
	{
		return prev_;
	}
	void set_prev(at::HostAllocator *p)
	{
		prev_ = p;
	}

private:
	at::DataPtr adopt(pb_lease *l, size_t n, int64_t acquire_us)
	{
		auto *b = new Block();
		b->ptr = api_.lease_data(l);
		b->size_bytes = n;
		b->leased_bytes = api_.lease_size(l);
		b->lease = l;
		{
			std::lock_guard<std::mutex> g(mu_);
			blocks_.insert(b);
			by_addr_[reinterpret_cast<uintptr_t>(b->ptr)] = b;
			c_.active.increase(1);
			c_.active_bytes.increase(n);
			c_.held.increase(1);
			c_.leased_bytes.increase(b->leased_bytes);
			c_.acquire_time_us.increase(acquire_us);
		}
		return {b->ptr, b, &host_delete, at::Device(at::DeviceType::CPU)};
	}

	// Ours by context (the DataPtr's), else by address: a slice's data pointer lies inside the block.
	Block *find_locked(void *ptr, void *ctx)
	{
		auto *b = static_cast<Block *>(ctx);
		if (b && blocks_.count(b) && b->allocated)
			return b;
		auto a = reinterpret_cast<uintptr_t>(ptr);
		auto it = by_addr_.upper_bound(a);
		if (it == by_addr_.begin())
			return nullptr;
		--it;
		Block *c = it->second;
		if (a < it->first + c->size_bytes && c->allocated)
			return c;
		return nullptr;
	}

	// pb_release, outside the lock (a round trip to the daemon, cuMemHostUnregister, munmap).
	void give_back(Block *b)
	{
		{
			std::lock_guard<std::mutex> g(mu_);
			blocks_.erase(b);
			by_addr_.erase(reinterpret_cast<uintptr_t>(b->ptr));
		}
		int64_t t0 = now_us();
		int r = api_.release(client_, b->lease);
		int64_t t1 = now_us();
		{
			std::lock_guard<std::mutex> g(mu_);
			c_.held.decrease(1);
			c_.leased_bytes.decrease(b->leased_bytes);
			c_.release_time_us.increase(t1 - t0);
			released_++;
			if (r < 0)
				release_errors_++; // the library freed it here anyway (pinbroker.h: pb_release)
		}
		delete b;
	}

	// Query every pending event once; give back the blocks whose last event completed.
	void process_events()
	{
		// cudaEventQuery during a capture in cudaStreamCaptureModeGlobal invalidates it: wait for its end.
		if (captures_ > 0 || in_child())
			return;
		std::deque<std::pair<std::unique_ptr<at::cuda::CUDAEvent>, Block *>> batch;
		{
			std::lock_guard<std::mutex> g(mu_);
			if (events_.empty())
				return;
			batch.swap(events_);
		}
		std::vector<Block *> done;
		std::deque<std::pair<std::unique_ptr<at::cuda::CUDAEvent>, Block *>> keep;
		for (auto &e : batch) {
			bool ready = true;
			try {
				ready = e.first->query();
			} catch (const std::exception &ex) {
				// A failed query means a broken context: its copies are not running any more.
				note_cuda_error(ex.what());
			}
			if (!ready) {
				keep.push_back(std::move(e));
				continue;
			}
			std::lock_guard<std::mutex> g(mu_);
			if (--e.second->events_pending == 0)
				done.push_back(e.second);
		}
		batch.clear(); // destroys completed events (cudaEventDestroy) outside the lock
		if (!keep.empty()) {
			std::lock_guard<std::mutex> g(mu_);
			for (auto &e : keep)
				events_.push_back(std::move(e));
		}
		for (Block *b : done)
			give_back(b);
	}

	void sync_devices()
	{
		try {
			int n = c10::cuda::device_count();
			for (int i = 0; i < n; i++) {
				if (!c10::cuda::hasPrimaryContext(static_cast<c10::DeviceIndex>(i)))
					continue;
				c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(i));
				cudaError_t err = cudaDeviceSynchronize();
				if (err != cudaSuccess) {
					(void)cudaGetLastError();
					note_cuda_error(cudaGetErrorString(err));
				}
			}
		} catch (const std::exception &e) {
			note_cuda_error(e.what());
		}
	}

	size_t blocks_waiting_locked() const
	{
		size_t n = 0;
		for (Block *b : blocks_)
			n += !b->allocated;
		return n;
	}

	void note_fallback(size_t n, const char *why, const std::string &reason)
	{
		bool first;
		{
			std::lock_guard<std::mutex> g(mu_);
			first = fallbacks_ == 0;
			fallbacks_++;
			fallback_bytes_ += n;
			fallback_reasons_[why]++;
			last_fallback_ = std::string(why) + (reason.empty() ? "" : ": " + reason);
		}
		if (first && std::strcmp(why, "CUDA graph capture") != 0)
			std::fprintf(
				stderr,
				"pinbroker: a pinned allocation of %zu bytes went to torch's own allocator (%s%s%s); "
				"further ones are counted in pinbroker.torch.allocator_stats()\n",
				n, why, reason.empty() ? "" : ": ", reason.c_str());
	}

	// A refusal that giving back our cached blocks could turn around: over a quota or the budget.
	bool refusal_may_be_ours(int r)
	{
		if (r != -EDQUOT && r != -EUSERS && r != -ENOSPC && r != -EBUSY)
			return false;
		struct pb_cache_stats cs {};
		return api_.cache_stats(client_, &cs) == 0 && cs.cached_bytes > 0;
	}

	// Tell the daemon what torch's own allocator holds pinned now (fallbacks, and blocks from before
	// install), when it changed: memory this process pins outside the budget. Not from a forked child
	// (the connection is the parent's), and not under the interposer (it counts those itself).
	void report_torch_pinned()
	{
		if (!report_fallbacks_ || in_child())
			return;
		int64_t bytes = 0;
		try {
			bytes = torch_pinned_bytes(prev_->get_stats());
		} catch (const std::exception &e) {
			note_cuda_error(e.what());
			return;
		}
		if (bytes < 0)
			bytes = 0;
		std::lock_guard<std::mutex> g(report_mu_);
		if (bytes == reported_unbrokered_)
			return;
		if (api_.report_unbrokered(client_, static_cast<uint64_t>(bytes)) == 0)
			reported_unbrokered_ = bytes;
	}

	void note_cuda_error(const char *what)
	{
		std::lock_guard<std::mutex> g(mu_);
		cuda_errors_++;
		last_cuda_error_ = what;
	}

	PbApi api_;
	pb_client *client_;
	std::string label_;
	uint8_t priority_;
	std::atomic<bool> uninstalled_{false};
	size_t cache_cap_ = 0;
	bool report_fallbacks_;
	std::mutex report_mu_;            // one unbrokered report at a time, in order
	int64_t reported_unbrokered_ = 0; // under report_mu_

	std::mutex mu_;                        // everything below
	std::unordered_set<Block *> blocks_;   // live and waiting blocks: what a context may name
	std::map<uintptr_t, Block *> by_addr_; // the same, by start address
	std::deque<std::pair<std::unique_ptr<at::cuda::CUDAEvent>, Block *>> events_;
	Counters c_;
	int64_t events_recorded_ = 0;
	int64_t released_ = 0;
	int64_t release_errors_ = 0;
	int64_t fallbacks_ = 0;
	int64_t fallback_bytes_ = 0;
	std::map<std::string, int64_t> fallback_reasons_;
	std::string last_fallback_;
	int64_t cuda_errors_ = 0;
	std::string last_cuda_error_;
};

// Process-lifetime: torch keeps the raw pointer, and tensors may outlive any Python object. Never freed
// (nor its connection closed: pb_disconnect would take memory from under live tensors; the kernel gives
// the leases back at exit).
PinbrokerHostAllocator *g_alloc = nullptr;
std::mutex g_install_mu;

void host_delete(void *ctx)
{
	if (ctx && g_alloc)
		g_alloc->free(ctx);
}

// Connect, build the allocator and install it. Returns false when it is installed already.
bool install(const std::string &lib_path, const std::string &socket, const std::string &label, int priority,
	     size_t cache_bytes, unsigned cache_slack_pct)
{
	std::lock_guard<std::mutex> g(g_install_mu);
	TORCH_CHECK(priority >= 0 && priority <= 255, "priority must be 0..255, not ", priority);
	at::HostAllocator *cur = at::getHostAllocator(at::kCUDA); // throws on a torch without CUDA
	if (g_alloc && cur == g_alloc)
		return false;
	if (!g_alloc) {
		PbApi api = load_api(lib_path);
		pb_client *c = nullptr;
		int r = api.connect(socket.empty() ? nullptr : socket.c_str(), &c);
		TORCH_CHECK(r >= 0, "pinbroker host allocator: cannot connect to ",
			    socket.empty() ? "pinbrokerd" : socket, ": ", api.last_error());
		g_alloc = new PinbrokerHostAllocator(api, c, label, static_cast<uint8_t>(priority));
		pthread_atfork(nullptr, nullptr, []() { g_forked.store(true, std::memory_order_relaxed); });
	}
	g_alloc->set_cache(cache_bytes, cache_slack_pct);
	g_alloc->set_prev(cur);
	g_alloc->set_priority(static_cast<uint8_t>(priority));
	at::setHostAllocator(at::kCUDA, g_alloc, static_cast<uint8_t>(priority));
	TORCH_CHECK(at::getHostAllocator(at::kCUDA) == g_alloc,
		    "pinbroker host allocator: at::setHostAllocator kept the current CUDA host allocator (one was "
		    "installed with a priority above ",
		    priority, "); pass a higher priority");
	g_alloc->set_installed(true);
	return true;
}

// Put the previous allocator back. Blocks still alive stay ours until freed. Returns false if not installed.
bool uninstall()
{
	std::lock_guard<std::mutex> g(g_install_mu);
	if (!g_alloc || at::getHostAllocator(at::kCUDA) != g_alloc)
		return false;
	at::setHostAllocator(at::kCUDA, g_alloc->prev(), g_alloc->priority());
	TORCH_CHECK(at::getHostAllocator(at::kCUDA) == g_alloc->prev(),
		    "pinbroker host allocator: at::setHostAllocator did not restore the previous allocator");
	g_alloc->set_installed(false);
	return true;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
	m.doc() = "pinbroker's at::HostAllocator: torch's pinned host memory leased from pinbrokerd";
	m.def("install", &install, py::arg("lib_path"), py::arg("socket"), py::arg("label"), py::arg("priority"),
	      py::arg("cache_bytes"), py::arg("cache_slack_pct"));
	m.def("uninstall", &uninstall);
	m.def("installed", []() { return g_alloc != nullptr && at::getHostAllocator(at::kCUDA) == g_alloc; });
	m.def("stats", []() {
		TORCH_CHECK(g_alloc, "pinbroker host allocator: not installed");
		return g_alloc->stats_dict();
	});
	m.def("empty_cache", []() {
		TORCH_CHECK(g_alloc, "pinbroker host allocator: not installed");
		py::gil_scoped_release nogil;
		g_alloc->empty_cache();
	});
}
