#!/bin/sh
# SPDX-License-Identifier: MIT
# Builds the image the Kubernetes manifests run (every container of the DaemonSet) from the project's own
# Debian packages, with no registry: a Debian 12 root made by debootstrap from a Debian mirror, the packages
# (scripts/build-deb.sh, or those in --debs) installed in it with apt, the device plugin, the DRA driver and
# listen-exec.py beside them with their gRPC stubs generated in the root, group pinbroker = gid 61000 (the
# socket's group in the manifests), then made an image by buildah (or podman, where buildah is missing)
# tagged pinbroker:VERSION, VERSION being the packages' (debian/changelog), as kustomization.yaml's newTag is.
# Run as root from anywhere in the checkout; needs debootstrap, buildah or podman, and the mirror.
# usage: deploy/kubernetes/build-image.sh [--debs DIR] [--mirror URL] [--work DIR] [--name NAME] [--tool buildah|podman]
#        deploy/kubernetes/build-image.sh --print-tag | --print-mirror
#   --debs DIR   the .deb files to install (default: built now by scripts/build-deb.sh into WORK/debs)
#   --mirror URL the Debian mirror (default: the host's first Debian source, else http://deb.debian.org/debian)
#   --work DIR   where the root and the packages are made (default build-image/ in the checkout; emptied first)
#   --name NAME  the image's name without the tag (default pinbroker; e.g. registry.example.com/pinbroker)
# Exit 0 built, 1 failed, 2 bad usage.
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
K8S=$SRC/deploy/kubernetes
VERSION=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$SRC/debian/changelog")
SUITE=bookworm
DEBS='' MIRROR='' WORK=$SRC/build-image NAME=pinbroker TOOL='' PRINT=0
usage() {
	sed -n 's/^# usage: /usage: /p; s/^#        /       /p' "$0" >&2
	exit 2
}
die() {
	echo "build-image.sh: $*" >&2
	exit 1
}
while [ $# -gt 0 ]; do
	case $1 in
	--print-tag) PRINT=1 ;;
	--print-mirror) PRINT=2 ;;
	--debs) [ $# -ge 2 ] || usage; DEBS=$(realpath "$2") && shift ;;
	--mirror) [ $# -ge 2 ] || usage; MIRROR=$2 && shift ;;
	--work) [ $# -ge 2 ] || usage; WORK=$(realpath -m "$2") && shift ;;
	--name) [ $# -ge 2 ] || usage; NAME=$2 && shift ;;
	--tool) [ $# -ge 2 ] || usage; TOOL=$2 && shift ;;
	*) usage ;;
	esac
	shift
done
[ -n "$VERSION" ] || die "no version in $SRC/debian/changelog"
TAG=$NAME:$VERSION
if [ -z "$MIRROR" ]; then
	MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
		grep -Eo 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n 1 | tr -d ' ')
	MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi
case $PRINT in
1) echo "$TAG" && exit 0 ;;
2) echo "$MIRROR" && exit 0 ;;
esac
[ "$(id -u)" = 0 ] || die "run as root: debootstrap and chroot need it (sudo $0)"
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
if [ -z "$TOOL" ]; then
	for t in buildah podman; do
		command -v $t >/dev/null && TOOL=$t && break
	done
fi
case $TOOL in
buildah | podman) command -v "$TOOL" >/dev/null || die "$TOOL not found (apt-get install $TOOL)" ;;
"") die "neither buildah nor podman found (apt-get install buildah)" ;;
*) usage ;;
esac

start=$(date +%s)
say() { echo "build-image.sh: [$(($(date +%s) - start)) s] $*"; }
ROOT=$WORK/rootfs
# Only this script's own folder is emptied: refuse anything that is not one it made or an empty one.
if [ -d "$WORK" ] && [ -n "$(ls -A "$WORK")" ] && [ ! -f "$WORK/.pinbroker-build-image" ]; then
	die "$WORK is not empty and not an earlier build-image.sh folder: give another --work"
fi
rm -rf "$ROOT" "$WORK/rootfs.tar"
mkdir -p "$WORK"
touch "$WORK/.pinbroker-build-image"

# 1. The packages, of this version.
if [ -z "$DEBS" ]; then
	say "building the Debian packages (scripts/build-deb.sh $WORK/debs)"
	"$SRC/scripts/build-deb.sh" "$WORK/debs" >"$WORK/build-deb.log" 2>&1 ||
		{ tail -n 30 "$WORK/build-deb.log" >&2; die "scripts/build-deb.sh failed (log: $WORK/build-deb.log)"; }
	DEBS=$WORK/debs
fi
for p in pinbroker libpinbroker1; do
	set -- "$DEBS"/${p}_*.deb
	[ -f "$1" ] || die "no ${p}_*.deb in $DEBS (scripts/build-deb.sh makes them)"
	v=$(dpkg-deb -f "$1" Version)
	[ "$v" = "$VERSION" ] || die "$1 is version $v, debian/changelog says $VERSION: build the packages again"
done

# 2. The root: Debian's minimal base from the mirror, then the packages and what they and the agents need.
say "debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
	{ tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log): is $MIRROR reachable?"; }
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
# Nothing starts in the root while packages install.
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"
# The socket's group, at the gid the manifests give their containers (supplementalGroups: [61000]), before
# the package's sysusers entry would make it at another.
chroot "$ROOT" groupadd --system --gid 61000 pinbroker
mkdir -p "$ROOT/tmp/debs"
cp "$DEBS"/pinbroker_*.deb "$DEBS"/libpinbroker1_*.deb "$ROOT/tmp/debs/"
say "installing the packages in the root (apt-get from $MIRROR)"
{
	chroot "$ROOT" apt-get update &&
		chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
			"/tmp/debs/$(basename "$DEBS"/libpinbroker1_*.deb)" "/tmp/debs/$(basename "$DEBS"/pinbroker_*.deb)" \
			python3 python3-grpcio python3-protobuf \
			python3-grpc-tools python3-pkg-resources curl jq ca-certificates
} >"$WORK/apt.log" 2>&1 || { tail -n 20 "$WORK/apt.log" >&2; die "apt-get in the root failed (log: $WORK/apt.log)"; }

# 3. The Kubernetes agents, where the manifests run them, each with the shared module and its stubs.
L=$ROOT/usr/lib/pinbroker
mkdir -p "$L/device-plugin" "$L/dra" "$L/kubernetes"
cp "$K8S/device-plugin/pinbroker-device-plugin.py" "$K8S/device-plugin/api.proto" "$K8S/device-plugin/podresources.proto" \
	"$K8S/lib/pinbroker_k8s.py" "$L/device-plugin/"
cp "$K8S/dra/pinbroker-dra-driver.py" "$K8S/dra/dra.proto" "$K8S/dra/pluginregistration.proto" "$K8S/lib/pinbroker_k8s.py" \
	"$L/dra/"
cp "$K8S/listen-exec.py" "$L/kubernetes/"
chmod 755 "$L/device-plugin/pinbroker-device-plugin.py" "$L/dra/pinbroker-dra-driver.py" "$L/kubernetes/listen-exec.py"
{
	chroot "$ROOT" python3 /usr/lib/pinbroker/device-plugin/pinbroker_k8s.py gen-stubs /usr/lib/pinbroker/device-plugin \
		/usr/lib/pinbroker/device-plugin/api.proto /usr/lib/pinbroker/device-plugin/podresources.proto &&
		chroot "$ROOT" python3 /usr/lib/pinbroker/dra/pinbroker_k8s.py gen-stubs /usr/lib/pinbroker/dra \
			/usr/lib/pinbroker/dra/dra.proto /usr/lib/pinbroker/dra/pluginregistration.proto &&
		chroot "$ROOT" python3 -m compileall -q /usr/lib/pinbroker &&
		# The stubs are made: the generator goes.
		chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get purge -y --auto-remove python3-grpc-tools python3-pkg-resources
} >>"$WORK/apt.log" 2>&1 || { tail -n 20 "$WORK/apt.log" >&2; die "generating the gRPC stubs in the root failed (log: $WORK/apt.log)"; }

# 4. What the containers run must run; then the root is trimmed.
chroot "$ROOT" /usr/sbin/pinbrokerd --version >/dev/null || die "pinbrokerd does not run in the root"
chroot "$ROOT" /usr/bin/pinctl --version >/dev/null || die "pinctl does not run in the root"
chroot "$ROOT" python3 -c 'import sys, grpc; sys.path[:0] = ["/usr/lib/pinbroker/device-plugin", "/usr/lib/pinbroker/dra"]
import api_pb2_grpc, podresources_pb2_grpc, dra_pb2_grpc, pluginregistration_pb2_grpc' ||
	die "the agents' gRPC stubs do not import in the root"
chroot "$ROOT" python3 /usr/lib/pinbroker/kubernetes/listen-exec.py --help >/dev/null || die "listen-exec.py does not run in the root"
[ "$(chroot "$ROOT" getent group pinbroker | cut -d: -f3)" = 61000 ] || die "group pinbroker is not gid 61000 in the root"
chroot "$ROOT" apt-get clean
rm -rf "$ROOT/tmp/debs" "$ROOT/usr/sbin/policy-rc.d" "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin \
	"$ROOT"/var/log/apt/* "$ROOT/var/log/dpkg.log" "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/*
: >"$ROOT/etc/resolv.conf"

# 5. The image.
say "making $TAG with $TOOL"
tar -C "$ROOT" --numeric-owner -cf "$WORK/rootfs.tar" .
ENTRY='["/usr/sbin/pinbrokerd"]'
CMD='["--config", "/etc/pinbroker/pinbrokerd.conf"]'
if [ "$TOOL" = buildah ]; then
	ctr=$(buildah from scratch)
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	buildah add --quiet "$ctr" "$WORK/rootfs.tar" / >/dev/null
	buildah config --entrypoint "$ENTRY" --cmd "$CMD" --label org.opencontainers.image.version="$VERSION" \
		--label org.opencontainers.image.title=pinbroker --os linux --arch "$(dpkg --print-architecture)" "$ctr"
	buildah commit --quiet "$ctr" "$TAG" >/dev/null
else
	podman import --change "ENTRYPOINT $ENTRY" --change "CMD $CMD" \
		--change "LABEL org.opencontainers.image.version=$VERSION" "$WORK/rootfs.tar" "$TAG" >/dev/null
fi
rm -f "$WORK/rootfs.tar"
say "built $TAG ($(du -sh "$ROOT" | cut -f1) unpacked). Push it: $TOOL push $TAG docker://REGISTRY/pinbroker:$VERSION," \
	"and set newName in deploy/kubernetes/kustomization.yaml"
