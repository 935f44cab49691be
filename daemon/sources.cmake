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
  core/reservation.c # all-or-nothing reservations for groups of ranks: charged at once, taken by share
  core/recovery-format.c  # the fd-store state's records: encode, decode, validate
  core/tenant.c      # tenants: (uid, pid namespace, cgroup) as the ids the pool reuses chunks by
  core/revoker-policy.c   # the revoker's decisions: round timing, overdue leases, slices, reclaim deficit
  core/staged.c      # clients' staged-copy reports: checks, rates, totals
  core/unbrokered.c  # clients' reports of memory pinned outside the broker
  core/waitq-order.c # the wait queue's order: priority classes, FIFO within one, who may overtake
  core/warmseg.c     # warm-up work split: a big chunk's fill segments, the warm-up thread count
)

# The I/O shell, daemon/: every other file but main.c (which only pinbrokerd links), a folder per subsystem; what
# ties them (the loop's wiring, logging, limits, metrics, the pressure reaction) stays at the top.
set(PB_DAEMON_SHELL_SOURCES
  daemon.c           # the broker's verbs that reach memory, carried out: the core decides, the pool acts
  log.c metrics.c notify.c react.c rlimits.c
  timer-clock.c      # one-shot timers that end by the clock, not libev's cached loop time
  config/config.c config/config-doc.c config/config-keys.c config/config-value.c
  config/reload.c    # a new config at run time: SIGHUP and pinctl set
  holders/holders.c holders/holders-fdinfo.c holders/holders-memfd.c
  jobs/jobs-watch.c
  jobs/quota-store.c # the quota rules file: read at start, written on each change
  monitor/monitor.c monitor/monitor-cgroup.c monitor/monitor-proc.c monitor/monitor-psi.c
  peer/cgns-probe.c peer/peer-ns.c peer/peer-tenant.c
  pool/pool.c pool/pool-chunk.c pool/pool-pages.c pool/pool-place.c
  pool/audit.c pool/numa.c pool/prewarm.c pool/reserve.c pool/warmup.c
  recovery/recovery.c recovery/recovery-writer.c
  request/request.c request/reply.c request/req-admin.c request/req-client.c request/req-quota.c request/req-headroom.c
  request/req-reserve.c
  request/req-status.c request/waitq.c
  restart/restart.c restart/restart-journal.c restart/restart-scan.c
  revoker/revoker.c revoker/revoker-free.c revoker/revoker-hold.c revoker/revoker-round.c
  server/server.c server/conn.c server/listen.c
)

list(TRANSFORM PB_DAEMON_CORE_SOURCES PREPEND ${PB_DAEMON_DIR}/)
list(TRANSFORM PB_DAEMON_SHELL_SOURCES PREPEND ${PB_DAEMON_DIR}/)
# Each subsystem's folder is on the include path: a file names a header by its name alone ("pool.h").
set(PB_DAEMON_SHELL_DIRS config holders jobs monitor peer pool recovery request restart revoker server)
list(TRANSFORM PB_DAEMON_SHELL_DIRS PREPEND ${PB_DAEMON_DIR}/)
set(PB_DAEMON_INCLUDE_DIRS ${PB_DAEMON_DIR}/core ${PB_DAEMON_DIR} ${PB_DAEMON_SHELL_DIRS})
