#!/bin/bash
# SPDX-License-Identifier: MIT
# Tests the Debian packages: builds them (scripts/build-deb.sh: dpkg-buildpackage with debian/, in
# BUILD_DIR/deb-build), checks their control data and contents (dpkg-deb, and lintian where it is
# installed), installs pinbroker and libpinbroker1 with `dpkg -i` into a copy of the cached
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
for t in cmake dpkg-buildpackage dpkg-checkbuilddeps dpkg-parsechangelog dpkg-deb dpkg bc; do
	command -v $t >/dev/null || skip "$t not found (apt-get install cmake dpkg-dev debhelper bc)"
done
# debian/control's Build-Depends (debhelper, dh-python, ...): scripts/deps.sh --test installs them.
(cd "$SRC" && dpkg-checkbuilddeps 2>&1) || skip "the packages' build dependencies are missing (scripts/deps.sh --test)"

nspawn_cached_root

# --- the packages ---
mkdir -p "$BUILD"
DB=$BUILD/deb-build
t=$(date +%s.%N)
"$SRC/scripts/build-deb.sh" "$DB" >"$BUILD/deb-build.log" 2>&1 ||
	{ tail -n 30 "$BUILD/deb-build.log"; fail "scripts/build-deb.sh $DB failed (log: $BUILD/deb-build.log)"; }
lap "dpkg-buildpackage" "$t"
# The upstream version (project(VERSION)) and the package's, with its Debian revision (debian/changelog).
UVER=$(sed -n 's/^project(pinbroker VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
VER=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version)
ARCH=$(dpkg --print-architecture)
DEB=$DB/pinbroker_${VER}_${ARCH}.deb
LIBDEB=$DB/libpinbroker1_${VER}_${ARCH}.deb
DEVDEB=$DB/libpinbroker-dev_${VER}_${ARCH}.deb
PYDEB=$DB/python3-pinbroker_${VER}_all.deb
SLURMDEB=$DB/pinbroker-slurm_${VER}_all.deb
DBGDEBS=("$DB/pinbroker-dbgsym_${VER}_${ARCH}.deb" "$DB/libpinbroker1-dbgsym_${VER}_${ARCH}.deb")
for f in "$DEB" "$LIBDEB" "$DEVDEB" "$PYDEB" "$SLURMDEB" "${DBGDEBS[@]}"; do
	[ -s "$f" ] || fail "dpkg-buildpackage made no $f (log: $BUILD/deb-build.log)"
done
host_check "the package version $VER is upstream $UVER with a Debian revision" \
	sh -c "case '$VER' in '$UVER'-[0-9]*) exit 0 ;; *) exit 1 ;; esac"
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
	for d in "libpinbroker1 (= $VER)" libev4 libprotobuf-c1 libsystemd0 libc6; do
		grep -qF "$d" <<<"$depends" || { echo "missing: $d"; return 1; }
	done
}
host_check "pinbroker depends on libpinbroker1 (= $VER), libev4, libprotobuf-c1, libsystemd0, libc6" deps_ok
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
host_check "libpinbroker1: shlibs names libpinbroker 1, and an ldconfig trigger" \
	sh -c "grep -q '^libpinbroker 1 libpinbroker1 ' '$CTRL/lib/shlibs' && grep -qx 'activate-noawait ldconfig' '$CTRL/lib/triggers'"
# debian/libpinbroker1.symbols, checked against the library by dpkg-gensymbols -c4 in the build (issue 41).
host_check "libpinbroker1: a symbols file naming libpinbroker.so.1's pb_ symbols with their versions" \
	sh -c "grep -q '^libpinbroker.so.1 libpinbroker1 ' '$CTRL/lib/symbols' && grep -q '^ pb_acquire@PINBROKER_1 0.2.0' '$CTRL/lib/symbols'"
host_check "libpinbroker1: holds libpinbroker.so.1 (its SONAME), Multi-Arch: same" \
	sh -c "dpkg-deb -c '$LIBDEB' | grep '/libpinbroker.so.1 -> libpinbroker.so.1\\.' >/dev/null && [ \"\$(dpkg-deb -f '$LIBDEB' Multi-Arch)\" = same ]"
# The maintainer scripts are debhelper's (dh_installsysusers, dh_installtmpfiles, dh_installsystemd): the
# socket in the enable form, the service in the don't-enable form (re-enabled only where an admin had).
maint_ok() {
	local p=$CTRL/pinbroker/postinst
	grep -q 'Automatically added by dh_installsysusers' "$p" && grep -q 'Automatically added by dh_installtmpfiles' "$p" &&
		grep -q "deb-systemd-helper --quiet was-enabled 'pinbrokerd.socket'" "$p" &&
		grep -q "deb-systemd-invoke start 'pinbrokerd.socket'" "$p" &&
		grep -q "deb-systemd-helper debian-installed 'pinbrokerd.service'" "$p" &&
		! grep -q "deb-systemd-helper debian-installed 'pinbrokerd.socket'" "$p"
}
host_check "pinbroker: debhelper's postinst: sysusers, tmpfiles, the socket enabled and started, the service not enabled" maint_ok
contents=$(dpkg-deb -c "$DEB" | awk '{ print $6 }')
contents_ok() {
	local f
	for f in ./lib/systemd/system/pinbrokerd.socket ./lib/systemd/system/pinbrokerd.service \
		./lib/systemd/system/pinbroker-hugepages.service ./usr/lib/sysusers.d/pinbroker.conf \
		./usr/lib/tmpfiles.d/pinbroker.conf ./usr/lib/systemd/catalog/pinbroker.catalog \
		./usr/sbin/pinbrokerd ./usr/bin/pinctl ./etc/pinbroker/pinbrokerd.conf \
		./lib/systemd/system/pinbroker-metrics.socket ./lib/systemd/system/pinbroker-metrics.service \
		./usr/libexec/pinbroker-metrics-http \
		./usr/share/man/man8/pinbrokerd.8.gz ./usr/share/doc/pinbroker/copyright; do
		grep -qxF "$f" <<<"$contents" || { echo "missing: $f"; return 1; }
	done
	! grep -q '^\./usr/local/\|^\./usr/lib/systemd/system/\|/include/\|\.so\.[0-9]\|/dist-packages/' <<<"$contents" ||
		{ echo "misplaced: $(grep '^\./usr/local/\|^\./usr/lib/systemd/system/\|/include/\|\.so\.[0-9]\|/dist-packages/' <<<"$contents")"; return 1; }
}
host_check "pinbroker: units in /lib/systemd/system, snippets and catalog in /usr/lib, no library, header or Python" contents_ok
host_check "the unit in the package runs /usr/sbin/pinbrokerd --config /etc/pinbroker/pinbrokerd.conf" \
	sh -c "dpkg-deb --fsys-tarfile '$DEB' | tar -xO ./lib/systemd/system/pinbrokerd.service |
		grep -x 'ExecStart=/usr/sbin/pinbrokerd --config /etc/pinbroker/pinbrokerd.conf' >/dev/null"
dev=$(dpkg-deb -c "$DEVDEB")
dev_ok() {
	grep -q ' ./usr/include/pinbroker.h$' <<<"$dev" && grep -q 'libpinbroker.so -> libpinbroker.so.1$' <<<"$dev" &&
		grep -q '/libpinbroker.a$' <<<"$dev" && grep -q '/pkgconfig/pinbroker.pc$' <<<"$dev" &&
		grep -q '/man3/libpinbroker.3.gz$' <<<"$dev"
}
host_check "libpinbroker-dev: header, libpinbroker.so link, .a, pinbroker.pc, libpinbroker(3)" dev_ok
host_check "python3-pinbroker: Architecture all, the package in /usr/lib/python3/dist-packages, depends on libpinbroker1" \
	sh -c "[ \"\$(dpkg-deb -f '$PYDEB' Architecture)\" = all ] &&
		dpkg-deb -c '$PYDEB' | grep ' ./usr/lib/python3/dist-packages/pinbroker/__init__.py$' >/dev/null &&
		dpkg-deb -f '$PYDEB' Depends | grep -q 'libpinbroker1 (>= $VER)' && dpkg-deb -f '$PYDEB' Depends | grep -q python3"
slurm_ok() {
	local c f
	c=$(dpkg-deb -c "$SLURMDEB")
	for f in prolog epilog gres-count; do
		grep -q "^-rwxr-xr-x .* \./usr/lib/pinbroker/slurm/pinbroker-$f\.sh$" <<<"$c" || { echo "missing: pinbroker-$f.sh"; return 1; }
	done
	grep -q '/usr/share/doc/pinbroker-slurm/examples/slurm.conf.example$' <<<"$c" &&
		dpkg-deb -f "$SLURMDEB" Depends | grep -q '^pinbroker '
}
host_check "pinbroker-slurm: prolog, epilog, gres count executable in /usr/lib/pinbroker/slurm, examples, needs pinbroker" slurm_ok
dbg_ok() {
	local d
	for d in "${DBGDEBS[@]}"; do
		# Not grep -q: dpkg-deb would complain of the pipe closed early.
		dpkg-deb -c "$d" | grep '/usr/lib/debug/.build-id/.*\.debug$' >/dev/null || { echo "no .debug file in $d"; return 1; }
	done
}
host_check "pinbroker-dbgsym and libpinbroker1-dbgsym hold the binaries' debug symbols (dh_strip)" dbg_ok
if [ "${PINBROKER_DEB_LINTIAN:-1}" != 0 ] && command -v lintian >/dev/null; then
	t=$(date +%s.%N)
	lintian --tag-display-limit 0 "$DEB" "$LIBDEB" "$DEVDEB" "$PYDEB" "$SLURMDEB" "${DBGDEBS[@]}" >"$BUILD/deb-lintian.txt" 2>&1
	lap "lintian" "$t"
	sed 's/^/lintian: /' "$BUILD/deb-lintian.txt" | grep -v 'root privileges'
	if grep -q '^E: ' "$BUILD/deb-lintian.txt"; then host_notok "lintian reports no error (E:)"
	else host_ok "lintian reports no error (E:)"; fi
	# Every warning lintian would give is either fixed or overridden with its reason (debian/*.lintian-overrides).
	if grep -q '^W: ' "$BUILD/deb-lintian.txt"; then host_notok "lintian reports no warning (W:) that is not overridden"
	else host_ok "lintian reports no warning (W:) that is not overridden"; fi
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
host_check "dpkg -i libpinbroker1 pinbroker in a chroot (no systemd running) succeeds" test $rc = 0
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
