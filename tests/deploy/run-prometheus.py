#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""deploy/monitoring's dashboard against a real Prometheus scraping both routes of a real daemon.

usage: run-prometheus.py SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip (with the reason)

One daemon holds leases of two uids (root and nobody) in two jobs (/jobs/a and /jobs/b under the quota rule
/jobs/*), on a crafted proc root with swap, PSI and a cgroup limit (tests/fixtures/proc: cgroup-v2 with swapping's
meminfo and vmstat) so that every conditional metric is there too; the clients' /proc/PID/cgroup are written into
that root before they connect. Its metrics reach Prometheus both ways an operator sets up:
  textfile  metrics-path in a folder that prometheus-node-exporter's textfile collector reads (job "textfile");
  http      pinbroker-metrics-http as pinbroker-metrics.service runs it: given a listening socket ($LISTEN_FDS),
            as another uid than root (not an admin, like the unit's DynamicUser=), with --daemon-marker (job "http").
Then, through Prometheus' HTTP API: every pinbroker_ metric name the Grafana dashboard queries has at least one
series from each job; the README's headline query `sum by (cgroup) (pinbroker_job_leased_bytes)` gives both jobs
from each; per-uid bytes show both uids; and every dashboard expression, its $instance matching all, is non-empty.
Skips where prometheus or prometheus-node-exporter (Debian packages, in scripts/deps.sh --test) is missing, or
when not run as root (the second uid needs it).
"""
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

import deploycheck as dc  # tests/deploy, beside this script
from deploycheck import check, skip

SRC, BUILD = sys.argv[1], sys.argv[2]
PINBROKERD = os.path.join(BUILD, "daemon", "pinbrokerd")
PINCTL = os.path.join(BUILD, "client", "pinctl")
HTTP = os.path.join(BUILD, "client", "pinbroker-metrics-http")
DASHBOARD = os.path.join(SRC, "deploy", "monitoring", "pinbroker-dashboard.json")
NOBODY = 65534
LEASE = 4 << 20
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(what, fn, timeout_s=60.0):
    """fn() until it returns something true; that value, or None after timeout_s."""
    return dc.wait_for(what, fn, timeout_s, step_s=0.2, must=False)


def query(port, expr):
    """Prometheus' instant query: the result list, or None when the API did not answer."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            data = json.load(r)
    except (OSError, ValueError):
        return None
    return data["data"]["result"] if data.get("status") == "success" else None


def dashboard_exprs():
    with open(DASHBOARD, encoding="utf-8") as f:
        d = json.load(f)
    panels = list(d.get("panels", []))
    for p in list(panels):
        panels.extend(p.get("panels", []))
    return [(p.get("title", "?"), t["expr"]) for p in panels for t in p.get("targets", []) if t.get("expr")]


def headline():
    """The README's headline query, as the README writes it."""
    with open(os.path.join(SRC, "README.md"), encoding="utf-8") as f:
        m = re.search(r"`(sum by \(cgroup\) \(pinbroker_job_leased_bytes\))`", f.read())
    return m.group(1) if m else None


def crafted_root(tmp):
    """cgroup-v2's limit and PSI with swapping's meminfo and vmstat (as tests/deploy/run-monitoring.sh makes it)."""
    root = os.path.join(tmp, "root")
    fx = os.path.join(SRC, "tests", "fixtures", "proc")
    shutil.copytree(os.path.join(fx, "cgroup-v2"), root)
    for f in ("meminfo", "vmstat"):
        shutil.copy(os.path.join(fx, "swapping", "proc", f), os.path.join(root, "proc", f))
    return root


def group_ids():
    """The supplementary groups a non-root client needs for the daemon's socket: pinbroker where it exists."""
    try:
        import grp
        return [grp.getgrnam("pinbroker").gr_gid]
    except KeyError:
        return []


def as_user(uid, argv):
    """argv as uid (and its gid), with the groups the socket wants; the same pid runs argv (setpriv execs)."""
    if uid == 0:
        return argv
    groups = ",".join(map(str, group_ids()))
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}",
            f"--groups={groups}" if groups else "--clear-groups", "--"] + argv


def start_holder(root, sock, uid, cgroup, label, pinctl):
    """pinctl acquire held by uid, its /proc/PID/cgroup written in the crafted root before it connects."""
    argv = as_user(uid, ["sh", "-c", 'read go && exec "$0" --socket "$1" acquire 4M --hold 600 --label "$2"',
                         pinctl, sock, label])
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    d = os.path.join(root, "proc", str(p.pid))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "cgroup"), "w") as f:
        f.write(f"0::{cgroup}\n")
    p.stdin.write("go\n")
    p.stdin.flush()
    out = []
    for line in p.stdout:
        out.append(line.strip())
        if line.startswith("lease "):
            break
    check(out and out[-1].startswith("lease "), f"uid {uid} in {cgroup} holds a lease ({' / '.join(out)!r})")
    return p


def start_http(sock, marker, uid, http_bin):
    """pinbroker-metrics-http as the socket unit starts it: a listening socket as fd 3, $LISTEN_FDS, $LISTEN_PID."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    fd = lsock.fileno()
    pass_on = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.close(int(sys.argv[1])); "
               "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); os.execv(sys.argv[2], sys.argv[2:])")
    argv = as_user(uid, [sys.executable, "-c", pass_on, str(fd), http_bin, "--socket", sock, "--daemon-marker", marker])
    p = subprocess.Popen(argv, pass_fds=[fd], stdin=subprocess.DEVNULL)
    port = lsock.getsockname()[1]
    lsock.close()
    return p, port


def main():
    for tool in ("prometheus", "prometheus-node-exporter"):
        if not shutil.which(tool):
            skip(f"{tool} not found (Debian package {tool}; scripts/deps.sh --test installs it)")
    if os.geteuid() != 0:
        skip("not root: the second uid's client and the non-admin endpoint need setpriv as root")
    if not shutil.which("setpriv"):
        skip("setpriv not found (Debian package util-linux)")
    for f in (PINBROKERD, PINCTL, HTTP):
        if not os.access(f, os.X_OK):
            print(f"FAIL: no {f}: build first", file=sys.stderr)
            return 1
    exprs = dashboard_exprs()
    names = sorted({n for _, e in exprs for n in re.findall(r"\bpinbroker_[a-zA-Z0-9_]+\b", e)})
    head = headline()
    check(head is not None, "README.md has the headline query `sum by (cgroup) (pinbroker_job_leased_bytes)`")
    check(len(names) >= 30, f"the dashboard queries {len(names)} pinbroker_ metrics")

    tmp = tempfile.mkdtemp(prefix="pinbroker-prometheus.")
    os.chmod(tmp, 0o755)
    procs = []
    try:
        root = crafted_root(tmp)
        textdir = os.path.join(tmp, "textfile")
        os.mkdir(textdir)
        sock = os.path.join(tmp, "pinbroker.sock")
        dlog = open(os.path.join(tmp, "daemon.log"), "w")
        procs.append(subprocess.Popen(
            [PINBROKERD, "--socket", sock, "--budget", "64M", "--prewarm", "16M", "--proc-root", root,
             "--lock-memory", "no", "--metrics-path", os.path.join(textdir, "pinbroker.prom"),
             "--metrics-interval-ms", "1000", "--job-quota", "/jobs/*:32M",
             # The crafted root is a host under pressure (7.5% available, 12% swap free): thresholds under its
             # figures keep it lending, its signals still shown.
             "--tight-mem-available-pct", "2", "--critical-mem-available-pct", "1", "--tight-swap-free-pct", "5"],
            stdin=subprocess.DEVNULL, stdout=dlog, stderr=dlog))
        if not wait_for("the daemon", lambda: subprocess.run([PINCTL, "--socket", sock, "status"],
                                                             capture_output=True).returncode == 0, 15):
            print(open(os.path.join(tmp, "daemon.log")).read(), file=sys.stderr)
            return 1
        # The build tree may sit under a folder other uids cannot enter (a clone in /root, CI's 0700 temp dir):
        # the other uid runs copies from this 0755 one (pinctl finds its library beside it: RUNPATH $ORIGIN).
        bindir = os.path.join(tmp, "bin")
        os.mkdir(bindir)
        os.chmod(bindir, 0o755)
        for f in [PINCTL, HTTP] + glob.glob(os.path.join(BUILD, "client", "libpinbroker.so*")):
            shutil.copy2(f, bindir, follow_symlinks=False)
        pinctl = os.path.join(bindir, "pinctl")
        procs.append(start_holder(root, sock, 0, "/jobs/a/step_0", "prom-a", pinctl))
        procs.append(start_holder(root, sock, NOBODY, "/jobs/b", "prom-b", pinctl))

        marker = os.path.join(tmp, "pinbrokerd.running")
        open(marker, "w").close()
        http, http_port = start_http(sock, marker, NOBODY, os.path.join(bindir, "pinbroker-metrics-http"))
        procs.append(http)
        ne_port, prom_port = free_port(), free_port()
        procs.append(subprocess.Popen(
            ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ne_port}", "--collector.disable-defaults",
             "--collector.textfile", f"--collector.textfile.directory={textdir}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "ne.log"), "w")))
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                    f"  - job_name: textfile\n    static_configs:\n      - targets: ['127.0.0.1:{ne_port}']\n"
                    f"  - job_name: http\n    static_configs:\n      - targets: ['127.0.0.1:{http_port}']\n")
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prom.log"), "w")))

        jobs = ("textfile", "http")
        for job in jobs:
            check(wait_for(f"{job} up", lambda: (query(prom_port, f'up{{job="{job}"}} == 1') or None)) is not None,
                  f"Prometheus scrapes the {job} route (up == 1)")
        # Counters need two samples for rate(): wait until each route has been scraped a few times.
        for job in jobs:
            wait_for(f"{job} samples", lambda: query(
                prom_port, f'count_over_time(pinbroker_leases{{job="{job}"}}[1m]) >= 4'), 60)

        for job in jobs:
            empty = [n for n in names if not query(prom_port, f'{{__name__="{n}",job="{job}"}}')]
            check(not empty, f"{job}: every one of the dashboard's {len(names)} metrics has series"
                  + (f"; empty: {', '.join(empty)}" if empty else ""))
            if head:
                q = head.replace("pinbroker_job_leased_bytes", f'pinbroker_job_leased_bytes{{job="{job}"}}')
                got = {r["metric"].get("cgroup"): float(r["value"][1]) for r in query(prom_port, q) or []}
                check(got == {"/jobs/a": LEASE, "/jobs/b": LEASE},
                      f"{job}: the README's `{head}` gives both jobs' 4 MiB ({got})")
            got = {r["metric"].get("uid"): float(r["value"][1]) for r in
                   query(prom_port, f'sum by (uid) (pinbroker_uid_leased_bytes{{job="{job}"}})') or []}
            check(got == {"0": LEASE, str(NOBODY): LEASE}, f"{job}: per-uid bytes of both uids ({got})")

        empty = []
        for title, e in exprs:
            q = e.replace("$instance", ".*").replace("$__rate_interval", "1m").replace("$__interval", "1m")
            if not query(prom_port, q):
                empty.append(f"{title}: {e}")
        check(not empty, f"every one of the dashboard's {len(exprs)} expressions gives a result"
              + ("".join("\n  empty: " + x for x in empty)))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if dc.failures:
            for log in ("daemon.log", "prom.log", "ne.log"):
                path = os.path.join(tmp, log)
                if os.path.exists(path):
                    print(f"--- {log} (last lines)\n" + "".join(open(path).readlines()[-15:]), file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    return dc.exit_status()


if __name__ == "__main__":
    sys.exit(main())
