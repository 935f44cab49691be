#!/bin/sh
# SPDX-License-Identifier: MIT
# Install what pinbroker needs to build and test on Debian 12 (run as root).
set -eu
export DEBIAN_FRONTEND=noninteractive
PKGS="build-essential cmake pkg-config libev-dev libprotobuf-c-dev protobuf-c-compiler
      libsystemd-dev check jq"
# Tests: fuzzing (clang + libFuzzer runtime), valgrind, shellcheck (tests/deploy), the booted-systemd test, groff for rendering
# the man pages in the install test, and the Python package's tests (Debian's python3 with CPU torch, numpy, pytest; setuptools and pip to install it).
if [ "${1:-}" = "--test" ]; then
	PKGS="$PKGS clang libclang-rt-14-dev valgrind debootstrap systemd-container procps
	      python3 python3-pytest python3-numpy python3-torch python3-setuptools python3-pip groff-base
	      prometheus-node-exporter curl shellcheck"
fi
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "deps: installing$missing"
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
