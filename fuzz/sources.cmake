# SPDX-License-Identifier: MIT
# The fuzz harnesses, shared by fuzz/ and tests/fuzz-regress/. The daemon sources they link come from the one
# list in daemon/sources.cmake (fuzz/ rebuilds it instrumented; the replay tests link pb_daemon).
include(${CMAKE_SOURCE_DIR}/daemon/sources.cmake)
set(PB_FUZZ_DIR ${CMAKE_SOURCE_DIR}/fuzz)
set(PB_FUZZ_HARNESSES fuzz_request fuzz_fdpath)
