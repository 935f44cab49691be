# SPDX-License-Identifier: MIT
# The daemon sources a fuzz harness links (everything but main.c), shared by fuzz/ and tests/fuzz-regress/.
set(PB_FUZZ_DIR ${CMAKE_SOURCE_DIR}/fuzz)
set(PB_FUZZ_DAEMON_SOURCES
  ${CMAKE_SOURCE_DIR}/daemon/server.c
  ${CMAKE_SOURCE_DIR}/daemon/listen.c
  ${CMAKE_SOURCE_DIR}/daemon/request.c
  ${CMAKE_SOURCE_DIR}/daemon/react.c
  ${CMAKE_SOURCE_DIR}/daemon/req-client.c
  ${CMAKE_SOURCE_DIR}/daemon/req-admin.c
  ${CMAKE_SOURCE_DIR}/daemon/metrics.c
  ${CMAKE_SOURCE_DIR}/daemon/req-status.c
  ${CMAKE_SOURCE_DIR}/daemon/reply.c
  ${CMAKE_SOURCE_DIR}/daemon/revoker.c
  ${CMAKE_SOURCE_DIR}/daemon/waitq.c
  ${CMAKE_SOURCE_DIR}/daemon/jobs-watch.c
  ${CMAKE_SOURCE_DIR}/daemon/req-quota.c
  ${CMAKE_SOURCE_DIR}/daemon/monitor.c
  ${CMAKE_SOURCE_DIR}/daemon/monitor-proc.c
  ${CMAKE_SOURCE_DIR}/daemon/monitor-cgroup.c
  ${CMAKE_SOURCE_DIR}/daemon/monitor-psi.c
  # req-client.c and reply.c name the instance id and records leases for the fd store (both inert without recovery_init).
  ${CMAKE_SOURCE_DIR}/daemon/recovery.c
  ${CMAKE_SOURCE_DIR}/daemon/notify.c)
set(PB_FUZZ_HARNESSES fuzz_request fuzz_fdpath)
