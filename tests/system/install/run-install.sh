#!/bin/sh
# SPDX-License-Identifier: MIT
# `cmake --install BUILD --prefix P` into a temp prefix, as an unprivileged user where it can:
# every installed file stays under P, the unit's ExecStart and --config point into P, the .pc
# names P, the installed pinctl finds its library, and a program links the installed
# libpinbroker.a statically and runs (no daemon: pb_connect gives -ENOENT, acquire falls back).
# usage: run-install.sh BUILD_DIR SOURCE_DIR      exit 0 pass, 1 fail, 77 skip
set -u
BUILD=${1:?usage: run-install.sh BUILD_DIR SOURCE_DIR}
SRC=${2:?usage: run-install.sh BUILD_DIR SOURCE_DIR}

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

for t in cmake pkg-config cc; do
	command -v $t >/dev/null || skip "$t not found (apt-get install cmake pkg-config gcc)"
done

T=$(mktemp -d /tmp/pinbroker-install.XXXXXX) || fail "cannot create a temp directory under /tmp"
trap 'rm -rf "$T"' EXIT
chmod 0755 "$T"
P=$T/prefix

# As root, install as nobody: a step that writes outside the prefix (or into the build tree)
# then fails instead of quietly touching the host.
AS=
if [ "$(id -u)" = 0 ]; then
	if command -v setpriv >/dev/null &&
		setpriv --reuid=65534 --regid=65534 --clear-groups test -r "$BUILD/cmake_install.cmake"; then
		AS="setpriv --reuid=65534 --regid=65534 --clear-groups"
		mkdir -p "$T/dest" "$P" && chown 65534:65534 "$T/dest" "$P"
		# CMake always writes BUILD/install_manifest.txt; a user installing from their own
		# build tree owns it, so lend this one to nobody for the run.
		M=$BUILD/install_manifest.txt
		touch "$M" && OWNER=$(stat -c %u:%g "$M") && chown 65534 "$M" ||
			fail "cannot hand $M to nobody for the install"
		trap 'chown "$OWNER" "$M"; rm -rf "$T"' EXIT
	else
		echo "note: nobody cannot read $BUILD (or no setpriv); installing as root into $T"
	fi
fi

# 1. Into a DESTDIR, so that a path outside the prefix shows up instead of landing on the host.
DESTDIR=$T/dest $AS cmake --install "$BUILD" --prefix "$P" >"$T/install-destdir.log" 2>&1 ||
	{ cat "$T/install-destdir.log"; fail "cmake --install --prefix $P with DESTDIR=$T/dest failed (log above)"; }
outside=$(find "$T/dest" \( -type f -o -type l \) ! -path "$T/dest$P/*")
[ -z "$outside" ] || fail "cmake --install --prefix $P put these outside the prefix:
$outside"

# 2. Straight into the prefix, which is what the rest checks.
$AS cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 ||
	{ cat "$T/install.log"; fail "cmake --install --prefix $P failed (log above)"; }

for f in sbin/pinbrokerd bin/pinctl include/pinbroker.h lib/systemd/system/pinbrokerd.service \
	lib/systemd/system/pinbrokerd.socket lib/sysusers.d/pinbroker.conf lib/tmpfiles.d/pinbroker.conf \
	lib/systemd/catalog/pinbroker.catalog etc/pinbroker/pinbrokerd.conf etc/pinbroker/pinbrokerd.conf.sample \
	share/bash-completion/completions/pinctl share/bash-completion/completions/pinbrokerd \
	share/zsh/vendor-completions/_pinctl share/zsh/vendor-completions/_pinbrokerd \
	share/man/man8/pinbrokerd.8 share/man/man8/pinctl.8 share/man/man5/pinbrokerd.conf.5 \
	share/man/man3/libpinbroker.3 share/doc/pinbroker/LICENSE share/doc/pinbroker/CHANGELOG.md; do
	[ -e "$P/$f" ] || fail "cmake --install did not install $P/$f"
done
# pinbrokerd.conf(5) comes from the key table, so it names every key the installed daemon has.
keys=$("$P/sbin/pinbrokerd" --config-doc | sed -n 's/^| `\([a-z0-9-]*\)` |.*/\1/p')
[ -n "$keys" ] || fail "the installed pinbrokerd --config-doc lists no keys"
for k in $keys; do
	man_key=$(printf '%s' "$k" | sed 's/-/\\-/g')
	grep -qxF ".B $man_key" "$P/share/man/man5/pinbrokerd.conf.5" ||
		fail "pinbrokerd.conf.5 does not describe the key $k"
done
# libpinbroker(3) has an entry (.SS, made from the header's comments) for every function the
# installed header declares (a declaration's first line names it: TYPE [*]pb_NAME( ...).
funcs=$(sed -n 's/^[a-z][^(]*[ *]\(pb_[a-z0-9_]*\)(.*/\1/p' "$P/include/pinbroker.h")
[ -n "$funcs" ] || fail "found no pb_* function declared in the installed $P/include/pinbroker.h"
for f in $funcs; do
	grep -qE "^\.SS \"?([a-z0-9_]+, )*$f(,|\"|\$)" "$P/share/man/man3/libpinbroker.3" ||
		fail "libpinbroker.3 has no entry (.SS) for $f, which include/pinbroker.h declares"
done
# pinctl(8)'s COMMANDS section has an entry (a .TP tag) for every command of `pinctl --help`.
cmds=$(env -u LD_LIBRARY_PATH "$P/bin/pinctl" --help 2>&1 |
	awk '/^Commands:/ { on = 1; next } on && /^[^ ]/ { exit } on && /^  [a-z]/ { print $1 }')
[ -n "$cmds" ] || fail "the installed pinctl --help lists no command under \"Commands:\""
tags=$(awk '/^\.SH/ { on = ($2 == "COMMANDS") } on && tag { print } { tag = on && /^\.TP/ }' \
	"$P/share/man/man8/pinctl.8" | sed 's/^\.[A-Z]* *"\{0,1\}\([a-z-]*\).*/\1/')
for cmd in $cmds; do
	echo "$tags" | grep -qxF "$cmd" ||
		fail "pinctl.8 has no entry for the command $cmd in its COMMANDS section (pinctl --help lists it)"
done
# pinbrokerd(8)'s OPTIONS section names every option of `pinbrokerd --help` above the config keys.
opts=$("$P/sbin/pinbrokerd" --help | awk '/^Every config key is also an option/ { exit }
	$1 ~ /^-/ { for (i = 1; i <= NF; i++) { o = $i; sub(/,$/, "", o); if (o !~ /^-/) break; print o } }')
[ -n "$opts" ] || fail "the installed pinbrokerd --help lists no option"
page8=$(awk '/^\.SH/ { on = ($2 == "OPTIONS") } on' "$P/share/man/man8/pinbrokerd.8" | sed 's/\\-/-/g')
for o in $opts; do
	echo "$page8" | grep -qE -- "(^|[^a-zA-Z0-9-])$o([^a-zA-Z0-9-]|\$)" ||
		fail "pinbrokerd.8 does not describe the option $o in its OPTIONS section (pinbrokerd --help lists it)"
done
# Every page renders without a warning (groff-base, which man-db needs, has the man macros).
if command -v groff >/dev/null; then
	for page in man8/pinbrokerd.8 man8/pinctl.8 man5/pinbrokerd.conf.5 man3/libpinbroker.3; do
		w=$(groff -man -Tutf8 -ww -z "$P/share/man/$page" 2>&1)
		[ -z "$w" ] || fail "groff warns about $page: $w"
		grep -q '@PROJECT_VERSION@' "$P/share/man/$page" && fail "$page still says @PROJECT_VERSION@"
	done
else
	echo "note: no groff (apt-get install groff-base): the man pages were not rendered"
fi

lib=$(find "$P" -name libpinbroker.a) && [ -n "$lib" ] || fail "no libpinbroker.a under $P"
LIBDIR=$(dirname "$lib")
[ -e "$LIBDIR/pkgconfig/pinbroker.pc" ] || fail "no pinbroker.pc in $LIBDIR/pkgconfig"

# The unit: ExecStart runs the installed daemon with the installed config.
exec_start=$(sed -n 's/^ExecStart=//p' "$P/lib/systemd/system/pinbrokerd.service")
# shellcheck disable=SC2086 # split ExecStart into its words
set -- $exec_start
[ "$1" = "$P/sbin/pinbrokerd" ] || fail "pinbrokerd.service runs '$1', not the installed $P/sbin/pinbrokerd"
[ "${2:-}" = --config ] && [ "${3:-}" = "$P/etc/pinbroker/pinbrokerd.conf" ] ||
	fail "pinbrokerd.service passes '${2:-} ${3:-}', not --config $P/etc/pinbroker/pinbrokerd.conf"
"$P/sbin/pinbrokerd" --check-config --config "$3" >"$T/check-config.log" 2>&1 ||
	{ cat "$T/check-config.log"; fail "the installed daemon rejects the installed config $3"; }
# The optional HTTP metrics endpoint's service runs the installed server (in libexec); its first word.
exec_start=$(sed -n 's/^ExecStart=//p' "$P/lib/systemd/system/pinbroker-metrics.service")
exec_start=${exec_start%% *}
[ -x "$exec_start" ] && [ "${exec_start#"$P"/}" != "$exec_start" ] ||
	fail "pinbroker-metrics.service runs '$exec_start', not an installed server under $P"
[ -f "$P/lib/systemd/system/pinbroker-metrics.socket" ] || fail "no pinbroker-metrics.socket installed"

# Without --config (started by hand), the installed daemon reads its prefix's config, not /etc's (issue 23): --help
# names it as the default, a bad line added to it is what --check-config reports, and without it the config passes.
conf=$P/etc/pinbroker/pinbrokerd.conf
"$P/sbin/pinbrokerd" --help | grep -qF "read FILE (default $conf;" ||
	fail "the installed pinbrokerd --help does not name $conf as its default config: $("$P/sbin/pinbrokerd" --help | grep -- --config)"
cp "$conf" "$T/conf.saved"
echo "no-such-key-of-the-install-test = 1" >>"$conf"
"$P/sbin/pinbrokerd" --check-config >"$T/check-default.log" 2>&1 &&
	fail "the installed daemon without --config did not read $conf (a bad line there passed --check-config)"
grep -qF "$conf:" "$T/check-default.log" ||
	{ cat "$T/check-default.log"; fail "the installed daemon without --config did not report $conf's bad line"; }
cat "$T/conf.saved" >"$conf"
env -u PINBROKER_SOCKET "$P/sbin/pinbrokerd" --check-config >"$T/check-default.log" 2>&1 ||
	{ cat "$T/check-default.log"; fail "the installed daemon without --config rejects $conf"; }

export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
pc_prefix=$(pkg-config --variable=prefix pinbroker) || fail "pkg-config cannot read $LIBDIR/pkgconfig/pinbroker.pc"
[ "$pc_prefix" = "$P" ] || fail "pinbroker.pc says prefix=$pc_prefix, not $P"

# The installed pinctl finds the installed libpinbroker.so.1 on its own (RUNPATH $ORIGIN/..).
so=$(env -u LD_LIBRARY_PATH ldd "$P/bin/pinctl" | sed -n 's/.*libpinbroker\.so\.1 => \([^ ]*\).*/\1/p')
[ -n "$so" ] && [ "$(readlink -f "$so")" = "$(readlink -f "$LIBDIR/libpinbroker.so.1")" ] ||
	fail "the installed pinctl loads libpinbroker.so.1 from '${so:-nowhere}', not $LIBDIR"
env -u LD_LIBRARY_PATH "$P/bin/pinctl" --help >/dev/null 2>&1 || fail "the installed pinctl --help does not run"

# Like the shared library's version script: the archive defines no global name but pb_*.
if command -v nm >/dev/null; then
	extra=$(nm -g --defined-only "$lib" | awk 'NF == 3 && $3 !~ /^pb_/ { print $3 }' | sort -u)
	[ -z "$extra" ] || fail "$lib defines global symbols outside pb_*, which can clash with a program's own:
$extra"
fi

# A static link of the installed archive, with what pkg-config --static lists; libc stays dynamic.
cflags=$(pkg-config --cflags pinbroker) && libs=$(pkg-config --static --libs pinbroker) ||
	fail "pkg-config --static --libs pinbroker failed"
libs=$(echo "$libs" | sed 's/-lpinbroker/-Wl,-Bstatic -lpinbroker -Wl,-Bdynamic/')
# An ASan/UBSan build's archive needs the sanitizer runtimes at link time.
[ "${PINBROKER_SANITIZED:-0}" = 1 ] && libs="-fsanitize=address,undefined $libs"
# shellcheck disable=SC2086
cc -o "$T/static-link" "$SRC/tests/system/install/static-link.c" $cflags $libs >"$T/cc.log" 2>&1 ||
	{ cat "$T/cc.log"; fail "linking against the installed libpinbroker.a failed: cc ... $cflags $libs"; }
if readelf -d "$T/static-link" | grep -q 'NEEDED.*libpinbroker'; then
	fail "the static link still needs libpinbroker.so"
fi
"$T/static-link" "$T/no-such.sock" || fail "the statically linked program failed (output above)"
# examples/acquire.c builds out of the tree with the one line of README.md and docs/library.md, and falls back without a daemon.
dyn=$(pkg-config --libs pinbroker)
[ "${PINBROKER_SANITIZED:-0}" = 1 ] && dyn="-fsanitize=address,undefined $dyn"
# shellcheck disable=SC2086
cc -o "$T/acquire" "$SRC/examples/acquire.c" $cflags $dyn >"$T/cc-example.log" 2>&1 ||
	{ cat "$T/cc-example.log"; fail "examples/acquire.c does not build against the installed library"; }
out=$(PINBROKER_SOCKET=$T/no-such.sock LD_LIBRARY_PATH=$LIBDIR "$T/acquire" 4096 2>&1) ||
	fail "examples/acquire.c failed: $out"
echo "$out" | grep -q "ordinary pageable memory" || fail "examples/acquire.c did not fall back: $out"
echo "ok: installed under $P; static link: cc $cflags $libs"
