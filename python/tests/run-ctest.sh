#!/bin/sh
# SPDX-License-Identifier: MIT
# ctest's entry to the Python package's tests: pytest on python/tests against this build's pinbrokerd,
# pinctl and libpinbroker (PINBROKERD, PINCTL, PINBROKER_LIBRARY, set by python/CMakeLists.txt).
# Exits 77 (skipped) where they cannot run, and never passes with no test run.
set -u
PY=${PINBROKER_PYTHON:-/usr/bin/python3}
here=$(dirname "$0")

case "${PINBROKER_SANITIZED:-0}" in
1 | ON | on | TRUE | true)
	# ctypes would load an ASan-instrumented libpinbroker into an uninstrumented interpreter: that
	# needs LD_PRELOAD of libasan and leak checking off for Python itself. The same tests run in the
	# plain build, and the library's own suites run under ASan.
	echo "python_pinbroker: skipped in the sanitizer build (libpinbroker is built with ASan/UBSan; run it in the plain build)"
	exit 77
	;;
esac
if [ ! -x "$PY" ]; then
	echo "python_pinbroker: skipped: no $PY (set PINBROKER_PYTHON, or apt-get install python3)"
	exit 77
fi
if ! "$PY" -c 'import pytest' 2>/dev/null; then
	echo "python_pinbroker: skipped: pytest is not installed for $PY (apt-get install python3-pytest, or scripts/deps.sh --test)"
	exit 77
fi
for m in numpy torch; do
	"$PY" -c "import $m" 2>/dev/null ||
		echo "python_pinbroker: $m is not installed for $PY: its tests are skipped (apt-get install python3-$m)"
done

cd "$here/.." || exit 1
# No bytecode or pytest cache written into the source tree.
PYTHONDONTWRITEBYTECODE=1 "$PY" -m pytest -q -rs -p no:cacheprovider tests "$@"
rc=$?
if [ "$rc" = 5 ]; then
	echo "python_pinbroker: pytest collected no tests: failing rather than passing with nothing run"
	exit 1
fi
exit "$rc"
