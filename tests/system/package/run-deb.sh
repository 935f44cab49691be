#!/bin/bash
# SPDX-License-Identifier: MIT
# Tests the Debian packages: builds them (scripts/build-deb.sh, a Release build for /usr in
# BUILD_DIR/deb-build), checks their control data and contents (dpkg-deb, and lintian where it is
# installed), installs pinbroker and libpinbroker0 with `dpkg -i` into a copy of the cached
# pristine bookworm root in a chroot (no systemd running: the image-build path), boots it with
# systemd-nspawn and runs tests/system/package/in-guest-deb.sh there: what the postinst left, socket
# activation, a lease, the catalog, a reinstall (upgrade), `dpkg -r`, `dpkg -P`, and a live
# `dpkg -i`. Reports "N passed, N failed".
#
# usage: run-deb.sh [BUILD_DIR]       (the packages are built in BUILD_DIR/deb-build)
# env:   PINBROKER_NSPAWN_CACHE   root cache (default /var/cache/pinbroker-test/bookworm-root;
#                                 tests/system/lib/nspawn-lib.sh, shared with run-nspawn.sh)
#        PINBROKER_NSPAWN_MIRROR  Debian mirror for a first debootstrap (default: apt's own)
#        PINBROKER_DEB_TIMEOUT    seconds the booted guest may take (default 240)
#        PINBROKER_DEB_LINTIAN=0  leave lintian out even where it is installed
#        PINBROKER_NSPAWN_KEEP=1  keep the per-run root copy for debugging
# Exits 0 when every check passed, 1 when one failed, 77 (skip) where it cannot run.
set -u
SRC=$(cd "$(dirname "$0")/../../.." && pwd)
BUILD=$(realpath -m "${1:-$SRC/build}")
TIMEOUT=${PINBROKER_DEB_TIMEOUT:-240}

. "$SRC/tests/system/lib/nspawn-lib.sh"
nspawn_require
for t in cmake cpack dpkg-deb dpkg bc; do
	command -v $t >/dev/null || skip "$t not found (apt-get install cmake dpkg bc)"
done

nspawn_cached_root

# --- the packages ---
mkdir -p "$BUILD"
DB=$BUILD/deb-build
t=$(date +%s.%N)
"$SRC/scripts/build-deb.sh" "$DB" >"$BUILD/deb-build.log" 2>&1 ||
	{ tail -n 30 "$BUILD/deb-build.log"; fail "scripts/build-deb.sh $DB failed (log: $BUILD/deb-build.log)"; }
lap "build + cpack" "$t"
VER=$(sed -n 's/^project(pinbroker VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
ARCH=$(dpkg --print-architecture)
DEB=$DB/pinbroker_${VER}_${ARCH}.deb
LIBDEB=$DB/libpinbroker0_${VER}_${ARCH}.deb
DEVDEB=$DB/libpinbroker-dev_${VER}_${ARCH}.deb
for f in "$DEB" "$LIBDEB" "$DEVDEB"; do
	[ -s "$f" ] || fail "cpack -G DEB made no $f (log: $BUILD/deb-build.log)"
done
echo "packages: $(cd "$DB" && ls -1 ./*.deb | tr '\n' ' ')"

# --- their control data and contents ---
field() { dpkg-deb -f "$1" "$2"; }
depends=$(field "$DEB" Depends)
echo "pinbroker: Depends: $depends"
host_check "pinbroker: Package, Version $VER, Section admin, a Maintainer" \
	test "$(field "$DEB" Package)/$(field "$DEB" Version)/$(field "$DEB" Section)" = "pinbroker/$VER/admin" -a \
	-n "$(field "$DEB" Maintainer)"
deps_ok() {
	local d
	for d in "libpinbroker0 (= $VER)" libev4 libprotobuf-c1 libsystemd0 libc6; do
		grep -qF "$d" <<<"$depends" || { echo "missing: $d"; return 1; }
	done
}
host_check "pinbroker depends on libpinbroker0 (= $VER), libev4, libprotobuf-c1, libsystemd0, libc6" deps_ok
CTRL=$(mktemp -d /tmp/pinbroker-debctl.XXXXXX)
trap 'rm -rf "$CTRL"' EXIT
dpkg-deb -e "$DEB" "$CTRL/pinbroker"
dpkg-deb -e "$LIBDEB" "$CTRL/lib"
scripts_ok() {
	local s
	for s in postinst prerm postrm; do
		[ "$(stat -c %a "$CTRL/pinbroker/$s")" = 755 ] && sh -n "$CTRL/pinbroker/$s" || return 1
	done
}
host_check "pinbroker: postinst, prerm, postrm are 0755 and parse" scripts_ok
host_check "pinbroker: /etc/pinbroker/pinbrokerd.conf is a conffile" grep -qx /etc/pinbroker/pinbrokerd.conf "$CTRL/pinbroker/conffiles"
host_check "libpinbroker0: shlibs names libpinbroker 0, and an ldconfig trigger" \
	sh -c "grep -q '^libpinbroker 0 libpinbroker0 ' '$CTRL/lib/shlibs' && grep -qx 'activate-noawait ldconfig' '$CTRL/lib/triggers'"
contents=$(dpkg-deb -c "$DEB" | awk '{ print $6 }')
contents_ok() {
	local f
	for f in ./lib/systemd/system/pinbrokerd.socket ./lib/systemd/system/pinbrokerd.service \
		./lib/systemd/system/pinbroker-hugepages.service ./usr/lib/sysusers.d/pinbroker.conf \
		./usr/lib/tmpfiles.d/pinbroker.conf ./usr/lib/systemd/catalog/pinbroker.catalog \
		./usr/sbin/pinbrokerd ./usr/bin/pinctl ./etc/pinbroker/pinbrokerd.conf \
		./usr/share/man/man8/pinbrokerd.8.gz ./usr/share/doc/pinbroker/copyright; do
		grep -qxF "$f" <<<"$contents" || { echo "missing: $f"; return 1; }
	done
	! grep -q '^\./usr/local/\|^\./usr/lib/systemd/system/\|/include/\|\.so\.0' <<<"$contents" ||
		{ echo "misplaced: $(grep '^\./usr/local/\|^\./usr/lib/systemd/system/\|/include/\|\.so\.0' <<<"$contents")"; return 1; }
}
host_check "pinbroker: units in /lib/systemd/system, snippets and catalog in /usr/lib, no library or header" contents_ok
host_check "the unit in the package runs /usr/sbin/pinbrokerd --config /etc/pinbroker/pinbrokerd.conf" \
	sh -c "dpkg-deb --fsys-tarfile '$DEB' | tar -xO ./lib/systemd/system/pinbrokerd.service |
		grep -x 'ExecStart=/usr/sbin/pinbrokerd --config /etc/pinbroker/pinbrokerd.conf' >/dev/null"
dev=$(dpkg-deb -c "$DEVDEB")
dev_ok() {
	grep -q ' ./usr/include/pinbroker.h$' <<<"$dev" && grep -q 'libpinbroker.so -> libpinbroker.so.0$' <<<"$dev" &&
		grep -q '/libpinbroker.a$' <<<"$dev" && grep -q '/pkgconfig/pinbroker.pc$' <<<"$dev" &&
		grep -q '/man3/libpinbroker.3.gz$' <<<"$dev"
}
host_check "libpinbroker-dev: header, libpinbroker.so link, .a, pinbroker.pc, libpinbroker(3)" dev_ok
if [ "${PINBROKER_DEB_LINTIAN:-1}" != 0 ] && command -v lintian >/dev/null; then
	t=$(date +%s.%N)
	lintian --tag-display-limit 0 "$DEB" "$LIBDEB" "$DEVDEB" >"$BUILD/deb-lintian.txt" 2>&1
	lap "lintian" "$t"
	sed 's/^/lintian: /' "$BUILD/deb-lintian.txt" | grep -v 'root privileges'
	if grep -q '^E: ' "$BUILD/deb-lintian.txt"; then host_notok "lintian reports no error (E:)"
	else host_ok "lintian reports no error (E:) ($(grep -c '^W: ' "$BUILD/deb-lintian.txt") warnings, docs/install.md lists them)"; fi
else
	echo "note: lintian not run (not installed, or PINBROKER_DEB_LINTIAN=0)"
fi

# --- a throwaway root: dpkg -i in a chroot, where no systemd runs ---
WORK=$(mktemp -d /var/tmp/pinbroker-deb.XXXXXX)
ROOT=$WORK/root
cleanup() {
	rm -rf "$CTRL"
	if [ "${PINBROKER_NSPAWN_KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf --one-file-system "$WORK"; fi
}
trap cleanup EXIT
nspawn_copy_root "$ROOT"
nspawn_probe "$ROOT" "$WORK/probe.log"

mkdir -p "$ROOT/var/tmp/pinbroker-debs"
cp "$DEB" "$LIBDEB" "$ROOT/var/tmp/pinbroker-debs/"
t=$(date +%s.%N)
chroot "$ROOT" dpkg -i "/var/tmp/pinbroker-debs/${LIBDEB##*/}" "/var/tmp/pinbroker-debs/${DEB##*/}" \
	>"$WORK/dpkg-chroot.log" 2>&1
rc=$?
lap "dpkg -i in the chroot" "$t"
sed 's/^/chroot dpkg: /' "$WORK/dpkg-chroot.log"
host_check "dpkg -i libpinbroker0 pinbroker in a chroot (no systemd running) succeeds" test $rc = 0
host_check "chroot: the postinst made group and user pinbroker (systemd-sysusers)" \
	chroot "$ROOT" sh -c 'getent group pinbroker >/dev/null && getent passwd pinbroker >/dev/null'
host_check "chroot: the postinst enabled pinbrokerd.socket (sockets.target.wants), not the service" \
	sh -c "[ -L '$ROOT/etc/systemd/system/sockets.target.wants/pinbrokerd.socket' ] &&
		[ ! -e '$ROOT/etc/systemd/system/multi-user.target.wants/pinbrokerd.service' ]"
host_check "chroot: journalctl --list-catalog knows pinbroker's lease-granted id" \
	sh -c "chroot '$ROOT' journalctl --list-catalog 2>/dev/null | grep -q '^a6e7a6a735a2449fa8b5dd36df35b42b '"
# Nothing may run from the root: the postinst must not start a daemon where systemd does not run.
none_in_root() {
	local p
	for p in $(pgrep -x pinbrokerd); do
		[ "$(readlink "/proc/$p/root")" = "$ROOT" ] && return 1
	done
	return 0
}
host_check "chroot: the postinst started no daemon" none_in_root

# --- boot and run the checks ---
nspawn_run_guest "$ROOT" pinbroker-deb-test "$SRC/tests/system/package/in-guest-deb.sh" "$TIMEOUT" "$BUILD/deb-results" \
	"$WORK/dpkg-chroot.log"
