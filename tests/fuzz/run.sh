#!/bin/sh
# SPDX-License-Identifier: MIT
# Run one libFuzzer harness for a given time: tests/fuzz/run.sh fuzz_request|fuzz_fdpath SECONDS [BUILD_DIR] [extra libFuzzer flags].
set -eu
h=${1:?harness: fuzz_request or fuzz_fdpath}
secs=${2:?seconds}
build=${3:-build-fuzz}
[ $# -ge 3 ] && shift 3 || shift $#
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$build/tests/fuzz/$h
[ -x "$bin" ] || { echo "$bin missing: CC=clang cmake -S . -B $build -DPINBROKER_FUZZ=ON -DBUILD_TESTING=OFF && cmake --build $build --target fuzz" >&2; exit 2; }
# New inputs go to a work corpus in the build tree; the committed seeds stay read-only input.
work=$build/tests/fuzz/work/$h
art=$build/tests/fuzz/artifacts/$h/
mkdir -p "$work" "$art"
exec "$bin" -max_total_time="$secs" -print_funcs=0 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
	-artifact_prefix="$art" "$@" "$work" "$src/tests/fuzz/corpus/$h"
