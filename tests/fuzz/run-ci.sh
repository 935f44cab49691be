#!/bin/sh
# SPDX-License-Identifier: MIT
# CI entry for fuzzing: build the harnesses, replay each over its corpus and regressions, then fuzz each briefly.
set -eu
secs=${1:-60}
src=$(cd "$(dirname "$0")/../.." && pwd)
fz=$src/tests/fuzz
build=${PINBROKER_FUZZ_BUILD:-$src/build-fuzz}
CC=${CC:-clang} cmake -S "$src" -B "$build" -DPINBROKER_FUZZ=ON -DBUILD_TESTING=OFF -DPINBROKER_GPU_TESTS=OFF >/dev/null
cmake --build "$build" --target fuzz -j"$(nproc)"
for h in fuzz_request fuzz_fdpath; do
	echo "== $h: corpus, slow seeds and regressions"
	mkdir -p "$fz/regressions/$h" "$fz/corpus-slow/$h"
	"$build/tests/fuzz/$h" -runs=0 -print_funcs=0 "$fz/corpus/$h" "$fz/corpus-slow/$h" "$fz/regressions/$h"
	echo "== $h: fuzzing for $secs s"
	"$fz/run.sh" "$h" "$secs" "$build"
done
echo "fuzzing: all harnesses clean"
