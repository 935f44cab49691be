# SPDX-License-Identifier: MIT
# The daemon's sources, listed once. A new daemon file is one line in one of the two lists below, nowhere
# else: pinbrokerd (daemon/CMakeLists.txt), the unit suites (tests/CMakeLists.txt), the fuzzers
# (tests/fuzz/CMakeLists.txt) and their replay tests all build from them.
set(PB_DAEMON_DIR ${CMAKE_CURRENT_LIST_DIR})

# The decision core, daemon/core/: no I/O. No syscalls, no files, no clock reads (callers pass the time in),
# no logging above debug. A file belongs here only if that holds; the pool it drives is the shell's.
set(PB_DAEMON_CORE_SOURCES
  core/admin.c       # who is an admin: root or admin-group, from the daemon's own namespaces
  core/broker.c      # the verbs tying budget, pool and leases; the pressure state's one writer
  core/backing.c     # shared-memory registrations charged once: page ranges per backing file
  core/budget.c      # accounting: bytes, leases, chunks and fds per uid
  core/cgns.c        # cgroup paths read in a cgroup namespace of our own, as the host names them
  core/classes.c     # chunk size classes: a lease's chunks, the warm carving, the plan for fd and map limits
  core/jobs.c        # job-quota rules and charges per cgroup
  core/lease.c       # the lease table and its state machine
  core/orphans.c     # the restart state file's text: what an earlier daemon lent
  core/pressure.c    # /proc parsers and the pressure policy
  core/quota-rules.c # the quota rules file's text: the rules pinctl quota set made, kept over restarts
  core/recovery-format.c  # the fd-store state's records: encode, decode, validate
  core/tenant.c      # tenants: (uid, pid namespace, cgroup) as the ids the pool reuses chunks by
  core/revoker-policy.c   # the revoker's decisions: round timing, overdue leases, slices, reclaim deficit
  core/staged.c      # clients' staged-copy reports: checks, rates, totals
  core/unbrokered.c  # clients' reports of memory pinned outside the broker
  core/waitq-order.c # the wait queue's order: priority classes, FIFO within one, who may overtake
  core/warmseg.c     # warm-up work split: a big chunk's fill segments, the warm-up thread count
)

# The I/O shell, daemon/: every other file but main.c (which only pinbrokerd links).
set(PB_DAEMON_SHELL_SOURCES
  audit.c cgns-probe.c config.c config-doc.c config-keys.c config-value.c holders.c holders-fdinfo.c holders-memfd.c
  jobs-watch.c listen.c log.c metrics.c peer-ns.c
  monitor.c monitor-cgroup.c monitor-proc.c monitor-psi.c rlimits.c
  notify.c numa.c peer-tenant.c pool.c pool-chunk.c pool-pages.c pool-place.c prewarm.c react.c
  recovery.c recovery-writer.c reload.c reply.c
  req-admin.c req-client.c req-quota.c req-status.c request.c
  quota-store.c      # the quota rules file: read at start, written on each change
  reserve.c restart.c restart-journal.c restart-scan.c revoker.c revoker-free.c revoker-hold.c revoker-round.c server.c waitq.c warmup.c
  timer-clock.c      # one-shot timers that end by the clock, not libev's cached loop time
)

list(TRANSFORM PB_DAEMON_CORE_SOURCES PREPEND ${PB_DAEMON_DIR}/)
list(TRANSFORM PB_DAEMON_SHELL_SOURCES PREPEND ${PB_DAEMON_DIR}/)
set(PB_DAEMON_INCLUDE_DIRS ${PB_DAEMON_DIR}/core ${PB_DAEMON_DIR})
