#!/bin/sh
# SPDX-License-Identifier: MIT
# Install what pinbroker needs to build and test on Debian 12 (run as root).
set -eu
export DEBIAN_FRONTEND=noninteractive
here=$(dirname "$0")
# shellcheck source=scripts/progress.sh
. "$here/progress.sh"
PKGS="build-essential cmake pkg-config libev-dev libprotobuf-c-dev protobuf-c-compiler
      libsystemd-dev check jq"
# Tests: fuzzing (clang + libFuzzer runtime), valgrind, shellcheck (tests/deploy), the booted-systemd test and the
# Debian package test (debootstrap, systemd-nspawn, bc for their timings), groff for rendering the man pages in the
# install test, lintian for the Debian packages (tests/system/package), the Kubernetes manifests' and patcher's tests, zsh
# for the zsh completion test, python3-grpcio and python3-grpc-tools for the Kubernetes device plugin's test (gRPC to a
# stand-in kubelet, its stubs generated from the vendored api.proto), and the Python package's tests (Debian's python3
# with CPU torch, numpy, pytest; setuptools and pip to install it). debhelper and dh-python: the Debian packages' build
# (debian/control's Build-Depends; scripts/build-deb.sh runs dpkg-buildpackage). abigail-tools: abidw/abidiff for the
# ABI check of libpinbroker (ctest abi_check, scripts/abi-update.sh). git: .ci/run tests a fresh clone. util-linux
# (setpriv, unshare), bsdutils (script) and procps (pgrep) are named although a full Debian has them: a minimal root
# (debootstrap minbase) may not.
if [ "${1:-}" = "--test" ]; then
	PKGS="$PKGS abigail-tools clang debhelper dh-python libclang-rt-14-dev valgrind debootstrap systemd-container procps bc
	      git util-linux bsdutils python3 python3-grpc-tools python3-grpcio python3-pytest python3-numpy python3-torch
	      python3-setuptools python3-pip groff-base zsh
	      prometheus-node-exporter curl lintian openssl yamllint python3-yaml shellcheck clang-format"
	# The Kubernetes manifests' test renders them with kubectl's kustomize: Debian's
	# kubernetes-client (kubectl 1.20), unless some kubectl is already installed (another
	# package's /usr/bin/kubectl would conflict with it).
	command -v kubectl >/dev/null || PKGS="$PKGS kubernetes-client"
	# deploy/kubernetes/build-image.sh commits the image with buildah (ctest deploy_k8s_image).
	PKGS="$PKGS buildah"
	# promtool (in Debian's prometheus) for deploy/monitoring's rules and the daemon's metrics
	# (tests/deploy/run-monitoring.sh, run-metrics-http.py), and the real Prometheus server that scrapes both
	# routes, node_exporter's textfile collector and the HTTP endpoint (tests/deploy/run-prometheus.py).
	PKGS="$PKGS prometheus"
fi
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	# shellcheck disable=SC2086
	set -- $missing
	log=$(mktemp /tmp/pbdeps.XXXXXX)
	quietly "deps: apt-get update" "$log" apt-get update
	say "deps: installing $# packages:$missing"
	# Its own progress lines ("Unpacking ...", "Setting up ...") go to the log, one of them shown now and then.
	quietly "deps: apt-get install ($# packages and what they need)" "$log" \
		apt-get install -y --no-install-recommends "$@"
	rm -f "$log"
	# Installing prometheus enables and starts a Prometheus server where systemd runs; the tests start their own
	# (on free loopback ports, with a scratch storage folder), so none is left running (without systemd, policy-rc.d or no init keeps it from starting).
	case " $missing " in
	*" prometheus "*)
		if [ -d /run/systemd/system ]; then
			systemctl disable --now prometheus.service >/dev/null 2>&1 || true
		fi
		;;
	esac
else
	say "deps: all $(echo "$PKGS" | wc -w) packages already installed"
fi
# The schema check of the Kubernetes manifests (tests/deploy/run-k8s.sh) uses the npm package
# kubernetes-models where node and npm are installed; without them that one check is skipped.
if [ "${1:-}" = "--test" ] && command -v npm >/dev/null; then
	# 5.1.0: schemas of Kubernetes 1.34+ (resource.k8s.io/v1 with consumable capacity, for deploy/overlays/dra).
	cache="$(dirname "$0")/../.cache/k8s-schema"
	grep -q '"version": "5.1.0"' "$cache/node_modules/kubernetes-models/package.json" 2>/dev/null ||
		{ say "deps: npm install kubernetes-models (the manifests' schema check)" &&
			npm install --silent --no-audit --no-fund --prefix "$cache" kubernetes-models@5.1.0 >/dev/null; } ||
		echo "deps: npm could not install kubernetes-models: the manifests' schema check will be skipped" >&2
fi
