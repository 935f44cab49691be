#!/bin/sh
# SPDX-License-Identifier: MIT
# deploy/kubernetes/build-image.sh for real: the Debian packages built by scripts/build-deb.sh, a debootstrap
# root from the host's Debian mirror, the image made by buildah (or podman), then checked: tagged
# pinbroker:VERSION with VERSION the packages' (debian/changelog) and kustomization.yaml's newTag; every
# program the manifests' containers run is in it (the base, deploy/overlays/dra and node-patcher), pinbrokerd,
# pinctl and pinbroker-metrics-http run there, the agents' gRPC stubs import, group pinbroker is gid 61000.
# Builds under BUILD_DIR/k8s-image and removes its image after; PINBROKER_IMAGE_DEBS=DIR takes ready packages of
# this tree instead of building them (build-image.sh --debs). As root; skips (77) without debootstrap,
# buildah or podman, the packages' build dependencies, or the mirror (several minutes: the packages are
# compiled, and the root's packages come from the mirror).
# usage: run-k8s-image.sh SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
set -u
SRC=${1:?usage: run-k8s-image.sh SOURCE_DIR BUILD_DIR}
BUILD=${2:?usage: run-k8s-image.sh SOURCE_DIR BUILD_DIR}
SCRIPT=$SRC/deploy/kubernetes/build-image.sh
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || skip "debootstrap not found (apt-get install debootstrap)"
TOOL=
for t in buildah podman; do
	command -v $t >/dev/null && TOOL=$t && break
done
[ -n "$TOOL" ] || skip "neither buildah nor podman found (apt-get install buildah)"
if ! command -v dpkg-checkbuilddeps >/dev/null || ! (cd "$SRC" && dpkg-checkbuilddeps >/dev/null 2>&1); then
	skip "the packages' build dependencies are missing (dpkg-checkbuilddeps; scripts/deps.sh --test installs them)"
fi
MIRROR=$(sh "$SCRIPT" --print-mirror)
if command -v curl >/dev/null; then
	curl -sf -m 15 -o /dev/null "$MIRROR/dists/bookworm/Release" || skip "the Debian mirror $MIRROR does not answer"
fi
VERSION=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$SRC/debian/changelog")
NAME=localhost/pinbroker-ctest
TAG=$NAME:$VERSION
W=$BUILD/k8s-image
[ "$(sh "$SCRIPT" --name $NAME --print-tag)" = "$TAG" ] || fail "build-image.sh --print-tag is not $TAG"
grep -q "newTag: $VERSION\$" "$SRC/deploy/kubernetes/kustomization.yaml" ||
	fail "kustomization.yaml's newTag is not the packages' version $VERSION"

# The packages the package_deb test built from this tree in this run (ctest runs it first), when they are there:
# building them again would double the test's time.
if [ -z "${PINBROKER_IMAGE_DEBS:-}" ] && ls "$BUILD/deb-build/pinbroker_${VERSION}_"*.deb >/dev/null 2>&1; then
	PINBROKER_IMAGE_DEBS=$BUILD/deb-build
	echo "using the packages package_deb built: $PINBROKER_IMAGE_DEBS"
fi
t0=$(date +%s)
sh "$SCRIPT" --work "$W" --name $NAME --tool $TOOL ${PINBROKER_IMAGE_DEBS:+--debs "$PINBROKER_IMAGE_DEBS"} \
	>"$BUILD/k8s-image.log" 2>&1 ||
	{ tail -n 30 "$BUILD/k8s-image.log"; fail "build-image.sh failed (log: $BUILD/k8s-image.log)"; }
echo "ok: build-image.sh made $TAG with $TOOL in $(($(date +%s) - t0)) s from $MIRROR"
cleanup() {
	[ -n "${ctr:-}" ] && buildah rm "$ctr" >/dev/null 2>&1
	$TOOL rmi "$TAG" >/dev/null 2>&1
	rm -rf "$W/rootfs"
}
trap cleanup EXIT

# The image's own record: its tag and version label.
if [ $TOOL = buildah ]; then
	labels=$(buildah inspect --type image \
		--format '{{index .OCIv1.Config.Labels "org.opencontainers.image.version"}} {{.OCIv1.Config.Entrypoint}}' "$TAG" 2>&1)
else
	labels=$(podman image inspect --format '{{index .Config.Labels "org.opencontainers.image.version"}} {{.Config.Entrypoint}}' \
		"$TAG" 2>&1)
fi
case $labels in
"$VERSION [/usr/sbin/pinbrokerd]"*) echo "ok: $TAG: version label $VERSION, entrypoint pinbrokerd" ;;
*) fail "$TAG's label and entrypoint: $labels" ;;
esac

# Its files, through a working container's mount (no container runtime needed), chrooted into.
if [ $TOOL = buildah ]; then
	ctr=$(buildah from "$TAG") || fail "buildah from $TAG"
	R=$(buildah mount "$ctr") || fail "buildah mount $ctr"
else
	R=$(podman image mount "$TAG") || fail "podman image mount $TAG"
fi
# Every program and script the containers' commands and probes name (quoted paths under /usr and /bin; the rest
# are the node's sockets and the ConfigMaps' files), in every variant of the DaemonSet.
paths=$(cat "$SRC/deploy/kubernetes/daemonset.yaml" "$SRC/deploy/overlays/dra/daemonset-dra.yaml" \
	"$SRC/deploy/overlays/node-patcher/daemonset-patcher.yaml" | grep -v '^ *#' |
	grep -Eo '"/(usr|bin)/[^"]+"' | tr -d '"' | sort -u)
[ -n "$paths" ] || fail "no command paths found in the manifests"
for p in $paths /usr/bin/curl /usr/bin/jq /usr/bin/pinctl; do
	[ -e "$R$p" ] || fail "$p (run by the manifests) is not in the image"
done
echo "ok: every program the manifests run is in the image: $(echo "$paths" | tr '\n' ' ')"
chroot "$R" /usr/sbin/pinbrokerd --version >/dev/null || fail "pinbrokerd does not run in the image"
chroot "$R" /usr/bin/pinctl --version | grep -q "${VERSION%%-*}" || fail "pinctl in the image is not version ${VERSION%%-*}"
chroot "$R" /usr/libexec/pinbroker-metrics-http --help >/dev/null 2>&1 || fail "pinbroker-metrics-http does not run in the image"
chroot "$R" python3 -c 'import sys, grpc; sys.path[:0] = ["/usr/lib/pinbroker/device-plugin", "/usr/lib/pinbroker/dra"]
import api_pb2_grpc, podresources_pb2_grpc, dra_pb2_grpc, pluginregistration_pb2_grpc' || fail "the agents' stubs do not import"
chroot "$R" python3 /usr/lib/pinbroker/kubernetes/listen-exec.py --help >/dev/null || fail "listen-exec.py does not run"
[ "$(chroot "$R" getent group pinbroker | cut -d: -f3)" = 61000 ] || fail "group pinbroker is not gid 61000 in the image"
! chroot "$R" python3 -c 'import grpc_tools' 2>/dev/null || fail "python3-grpc-tools is still in the image"
echo "ok: pinbrokerd, pinctl ${VERSION%%-*} and pinbroker-metrics-http run in the image, the stubs import, pinbroker is gid 61000"
[ $TOOL = buildah ] && buildah umount "$ctr" >/dev/null
[ $TOOL = podman ] && podman image unmount "$TAG" >/dev/null
echo "PASS: the image ($(du -sh "$W/rootfs" | cut -f1) unpacked)"
