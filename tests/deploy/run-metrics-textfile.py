#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""metrics-path in node_exporter's textfile folder, as a packaged install has it: the daemon's user may write there.

usage: run-metrics-textfile.py SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip (with the reason)

Debian's prometheus-node-exporter makes /var/lib/prometheus/node-exporter root:root 0755, and the daemon runs as
user pinbroker: its atomic rewrite (a fresh PATH.XXXXXX beside the file, renamed over it) failed with "Permission
denied". Here, in a scratch root with that folder root:root 0755: systemd-tmpfiles --create --root applies the
package's snippet (systemd/pinbroker.tmpfiles), then the real daemon, run as the snippet's user (pinbroker where
that user exists on this host, else nobody, the same line with the name replaced), must write its metrics file
there, and the folder's owner and its owner's and others' mode bits stay as they were. pinbrokerd.service allows the folder under
ProtectSystem=strict (ReadWritePaths=) as the snippet's user, and the package applies the snippet again when
node_exporter's folder is installed later (debian/pinbroker.triggers and postinst). Skips when not root, without
systemd-tmpfiles or setpriv, or where the scratch file system takes no ACLs.
"""
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile

import deploycheck as dc  # tests/deploy, beside this script
from deploycheck import check, skip

SRC, BUILD = sys.argv[1], sys.argv[2]
PINBROKERD = os.path.join(BUILD, "daemon", "pinbrokerd")
FOLDER = "/var/lib/prometheus/node-exporter"


def read(*parts):
    """A file of the source tree, or "" where it is missing (its checks then fail)."""
    try:
        with open(os.path.join(SRC, *parts), encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def static_checks():
    unit = read("systemd", "pinbrokerd.service")
    rw = [v for k, v in re.findall(r"^(ReadWritePaths)=(.*)$", unit, re.M)]
    check(any(FOLDER in p.lstrip("-").split() or "-" + FOLDER in p.split() for p in rw),
          f"pinbrokerd.service: ReadWritePaths= has {FOLDER} (got {rw})")
    user = re.search(r"^User=(\S+)$", unit, re.M)
    acl = re.search(r"^a\+?\s+" + re.escape(FOLDER) + r"\s.*\bu:([a-z_][a-z0-9_-]*):rwx\b", read("systemd", "pinbroker.tmpfiles"),
                    re.M)
    check(acl is not None and user is not None and acl.group(1) == user.group(1),
          f"pinbroker.tmpfiles: an ACL line giving the service's user rwx on {FOLDER}")
    check(re.search(r"^interest(-noawait)?\s+" + re.escape(FOLDER) + r"\s*$", read("debian", "pinbroker.triggers"),
                    re.M) is not None, f"debian/pinbroker.triggers: a file trigger on {FOLDER}")
    post = read("debian", "pinbroker.postinst")
    check("triggered" in post and "systemd-tmpfiles --create pinbroker.conf" in post,
          "debian/pinbroker.postinst: applies the tmpfiles snippet again when triggered")


def main():
    static_checks()
    if os.geteuid() != 0:
        skip("not root: the scratch folder must be root's and the daemon another user's")
    for tool in ("systemd-tmpfiles", "setpriv"):
        if not shutil.which(tool):
            skip(f"{tool} not found (Debian packages systemd, util-linux)")
    try:
        user = pwd.getpwnam("pinbroker")
    except KeyError:
        user = pwd.getpwnam("nobody")
    snippet = read("systemd", "pinbroker.tmpfiles").replace("u:pinbroker:", f"u:{user.pw_name}:")

    tmp = tempfile.mkdtemp(prefix="pinbroker-textfile.")
    d = None
    try:
        os.chmod(tmp, 0o755)
        folder = os.path.join(tmp, FOLDER.lstrip("/"))
        os.makedirs(folder)
        for p in (folder, os.path.dirname(folder), os.path.dirname(os.path.dirname(folder)), os.path.join(tmp, "var")):
            os.chmod(p, 0o755)
        conf = os.path.join(tmp, "pinbroker.conf")
        with open(conf, "w") as f:
            f.write(snippet)
        r = subprocess.run(["systemd-tmpfiles", "--create", f"--root={tmp}", conf], capture_output=True, text=True)
        if "not supported" in r.stderr:
            skip("the scratch file system takes no ACLs: " + r.stderr.strip())
        check(r.returncode == 0, f"systemd-tmpfiles --create applies the snippet (rc {r.returncode}: {r.stderr.strip()})")
        st = os.stat(folder)
        # The group bits of a folder with an ACL show the ACL's mask; the owner's and others' stay.
        check((st.st_uid, st.st_gid, st.st_mode & 0o707) == (0, 0, 0o705),
              f"the folder stays root:root, rwx for root and r-x for others (got {st.st_uid}:{st.st_gid} "
              f"{st.st_mode & 0o7777:o})")

        run = os.path.join(tmp, "sock")
        os.mkdir(run)
        os.chown(run, user.pw_uid, user.pw_gid)
        prom = os.path.join(folder, "pinbroker.prom")
        log = open(os.path.join(tmp, "daemon.log"), "w")
        d = subprocess.Popen(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--",
                              PINBROKERD, "--socket", os.path.join(run, "pb.sock"), "--budget", "16M", "--prewarm",
                              "0", "--lock-memory", "no", "--metrics-path", prom, "--metrics-interval-ms", "1000"],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        dc.wait_for(f"{prom} or the daemon's exit", lambda: os.path.exists(prom) or d.poll() is not None, 15.0,
                    step_s=0.1, must=False)
        ok = check(os.path.exists(prom), f"the daemon as {user.pw_name} writes {FOLDER}/pinbroker.prom")
        if ok:
            st = os.stat(prom)
            with open(prom) as f:
                text = f.read()
            check(st.st_uid == user.pw_uid and st.st_mode & 0o777 == 0o644 and "pinbroker_budget_bytes 16777216" in text,
                  f"the file is the daemon's, mode 0644, with its metrics ({st.st_uid} {st.st_mode & 0o777:o})")
    finally:
        if d is not None:
            d.terminate()
            d.wait()
            log.close()
            if dc.failures:
                print(open(os.path.join(tmp, "daemon.log")).read(), file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    return dc.exit_status()


if __name__ == "__main__":
    sys.exit(main())
