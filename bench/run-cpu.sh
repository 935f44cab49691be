#!/bin/sh
# SPDX-License-Identifier: MIT
# Run every CPU benchmark (lease, pressure, status) against an existing build dir (builds nothing) and save the output in bench/results/cpu-<date>.txt.
set -eu

usage() {
	echo "usage: bench/run-cpu.sh [BUILD_DIR] [-- extra options for both benchmarks, e.g. --quick]" >&2
	echo "BUILD_DIR defaults to ./build; build it first, e.g.:" >&2
	echo "  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j\$(nproc)" >&2
	exit 2
}

root=$(cd "$(dirname "$0")/.." && pwd)
build=build
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
	build=$1
	shift
fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
case $build in /*) ;; *) build=$(pwd)/$build ;; esac

daemon=$build/daemon/pinbrokerd
for bin in "$daemon" "$build/bench/core/bench_lease" "$build/bench/core/bench_pressure" "$build/bench/core/bench_status" \
	"$build/bench/core/bench_pagekind"; do
	[ -x "$bin" ] || { echo "run-cpu.sh: $bin not found or not executable" >&2; usage; }
done
if [ "$(id -u)" -ne 0 ] && [ "$(ulimit -l)" != unlimited ]; then
	echo "run-cpu.sh: the daemon and the floor mlock a 256 MiB pool: run as root or raise ulimit -l" >&2
	exit 1
fi

mkdir -p "$root/bench/results"
out=$root/bench/results/cpu-$(date +%Y-%m-%d).txt
failed=$out.failed
rm -f "$failed"
# POSIX sh has no pipefail: a failing benchmark leaves a marker instead.
{
	echo "# pinbroker CPU benchmarks, $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown) ($build)"
	echo
	"$build/bench/core/bench_lease" --daemon "$daemon" "$@" || echo "bench_lease failed: exit $?" >"$failed"
	echo
	"$build/bench/core/bench_pressure" --daemon "$daemon" --fixtures "$root/tests/fixtures/proc" "$@" ||
		echo "bench_pressure failed: exit $?" >>"$failed"
	echo
	"$build/bench/core/bench_status" --daemon "$daemon" "$@" || echo "bench_status failed: exit $?" >>"$failed"
	echo
	"$build/bench/core/bench_pagekind" --daemon "$daemon" "$@" || echo "bench_pagekind failed: exit $?" >>"$failed"
} 2>&1 | tee "$out.tmp"
if [ -e "$failed" ]; then
	cat "$failed" >&2
	rm -f "$failed"
	echo "run-cpu.sh: partial output left in $out.tmp" >&2
	exit 1
fi
mv "$out.tmp" "$out"
echo "run-cpu.sh: wrote $out" >&2
