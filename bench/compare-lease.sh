#!/bin/sh
# SPDX-License-Identifier: MIT
# Side by side: the lease round trip of two builds, run alternately on this machine (OLD first in odd rounds, NEW
# first in even ones) by one bench_lease (NEW's), so the program and its settings are the same and only
# libpinbroker and pinbrokerd differ
# (OLD's through LD_LIBRARY_PATH, which wins over the RUNPATH; the library's ABI is the same).
# Prints, per round and as medians, the judged rows' broker/floor ratios (2 MiB and 64 MiB no-touch
# p50, no-touch ops/s at 1 process, and the reported 4 KiB no-touch p50) of each build, and NEW's median
# against OLD's.
# With --roundtrip, NEW's bench_roundtrip instead: the absolute p50 µs of 4 KiB, 2 MiB and 64 MiB round trips
# (what a lease costs from one build to the next), which only a side-by-side run like this one can compare.
#   bench/compare-lease.sh [--roundtrip] OLD_BUILD NEW_BUILD [ROUNDS] [-- bench options]
#   (bench_lease's default options --quick --idle-s 1; bench_roundtrip's --iters 3000)
set -eu
usage="usage: bench/compare-lease.sh [--roundtrip] OLD_BUILD NEW_BUILD [ROUNDS] [-- bench options]"
mode=lease
if [ $# -gt 0 ] && [ "$1" = --roundtrip ]; then mode=roundtrip; shift; fi
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
old=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
shift 2
rounds=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then rounds=$1; shift; fi
case $rounds in '' | *[!0-9]*) echo "$usage" >&2; exit 2 ;; esac
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
if [ $mode = roundtrip ]; then
	[ $# -gt 0 ] || set -- --iters 3000
	bench=$new/bench/core/bench_roundtrip
else
	[ $# -gt 0 ] || set -- --quick --idle-s 1
	bench=$new/bench/core/bench_lease
fi
# NEW's bench_lease loads OLD's library through LD_LIBRARY_PATH by its SONAME (libpinbroker.so.1): a tree from
# before the SONAME bump (libpinbroker.so.0) cannot stand in.
for f in "$bench" "$old/daemon/pinbrokerd" "$new/daemon/pinbrokerd" "$old/client/libpinbroker.so.1"; do
	[ -e "$f" ] || { echo "compare-lease.sh: $f not found: build both trees first (both with SONAME libpinbroker.so.1)" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/pb-compare.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The judged rows of one bench_lease output: "2MiB_ratio 64MiB_ratio ops1_ratio", then the 4 KiB row's (reported);
# of bench_roundtrip's, "4KiB_p50 2MiB_p50 64MiB_p50" ("-" from a bench_roundtrip without the 64 MiB row).
rows() {
	if [ $mode = roundtrip ]; then
		awk -F'|' '/^\| 4 KiB \|/ { a = $3 + 0 } /^\| 2 MiB \|/ { b = $3 + 0 } /^\| 64 MiB \|/ { m = $3 + 0 }
			END { print a, b, (m == "" ? "-" : m) }' "$1"
		return
	fi
	awk -F'|' '
		/acquire → map \(MAP_POPULATE\), no touch/ { gsub(/[ *×]/, "", $9); r[$2+0 == 2 ? "s" : "l"] = $9 }
		/acquire → map one page, no touch/ { gsub(/[ *×]/, "", $9); p = $9 }
		/^\| map, no touch \| 1 \|/ { gsub(/[ *×]/, "", $6); o = $6 }
		END { print r["s"], r["l"], o, (p == "" ? "-" : p) }' "$1"
}

if [ $mode = roundtrip ]; then
	cols="4 KiB p50 µs|2 MiB p50 µs|64 MiB p50 µs"
else
	cols="2 MiB no-touch p50 ratio|64 MiB no-touch p50 ratio|ops/s 1 proc ratio|4 KiB no-touch p50 ratio"
fi
echo "| round | build | $(echo "$cols" | sed 's/|/ | /g') |"
echo "|---:|---|$(echo "$cols" | sed 's/[^|]*/---:/g')|"
i=1
while [ $i -le "$rounds" ]; do
	# OLD first in odd rounds, NEW first in even ones: whatever the order costs falls on both alike.
	if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
	for side in $order; do
		if [ "$side" = old ]; then dir=$old; else dir=$new; fi
		rc=0
		if [ "$side" = old ]; then
			LD_LIBRARY_PATH=$old/client "$bench" --daemon "$old/daemon/pinbrokerd" "$@" >"$tmp/$side.$i" 2>&1 || rc=$?
		else
			"$bench" --daemon "$new/daemon/pinbrokerd" "$@" >"$tmp/$side.$i" 2>&1 || rc=$?
		fi
		# bench_lease exits 1 when a target is missed: the figures are what this script compares. Any other
		# failure (bench_roundtrip judges nothing) leaves no figures, which a median must not take for 0.
		if [ $rc != 0 ] && { [ $mode = roundtrip ] || [ $rc != 1 ]; }; then
			echo "compare-lease.sh: round $i, $side ($dir) failed (exit $rc):" >&2
			tail -5 "$tmp/$side.$i" >&2
			exit 1
		fi
		echo "$i $side $(rows "$tmp/$side.$i")" >>"$tmp/all"
		echo "| $i | $side ($dir) | $(rows "$tmp/$side.$i" | sed 's/ / | /g') |"
	done
	i=$((i + 1))
done
# Medians per build, and NEW / OLD (under 1: NEW costs less than OLD; for bench_lease, against the same floor).
awk -v cols="$cols" -v unit="$([ $mode = roundtrip ] && echo " µs" || echo "×")" '
	function median(a, n,   i, j, t) {
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{ n[$2]++; nc = NF - 2; for (k = 3; k <= NF; k++) v[$2, k - 2, n[$2]] = $k }
	END {
		nh = split(cols, head, "|")
		printf "\n| median |"; for (k = 1; k <= nh; k++) printf " %s |", head[k]
		printf "\n|---|"; for (k = 1; k <= nh; k++) printf "---:|"
		printf "\n"
		for (s = 0; s < 2; s++) {
			side = s ? "new" : "old"
			printf "| %s |", side
			for (k = 1; k <= nc; k++) {
				delete a; for (i = 1; i <= n[side]; i++) a[i] = v[side, k, i]
				m[side, k] = median(a, n[side]); printf " %.2f%s |", m[side, k], unit
			}
			printf "\n"
		}
		printf "| new / old |"
		for (k = 1; k <= nc; k++) printf " %.3f |", m["new", k] / m["old", k]
		printf "\n"
	}' "$tmp/all"
