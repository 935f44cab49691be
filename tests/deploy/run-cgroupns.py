#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# pinbrokerd in a cgroup namespace of its own, as containerd, CRI-O and Docker (cgroup v2) run a container:
# the daemon moved into a cgroup D of this host and `unshare --cgroup`ed there, a client in a sibling cgroup C,
# a quota rule naming C by its host path. Four ways, each with what it must show:
#   mount     the host's cgroup tree visible (as the DaemonSet's read-only hostPath gives it), no CAP_SYS_ADMIN:
#             the daemon finds itself in that tree; status says "private" rooted at D's host path; an acquire
#             past C's quota is refused and one under it granted; status, jobs and metrics name C's host path;
#             the rule is seen through the host tree and released once C is removed
#   setns     a container's view (its own cgroup mount, the host's unmounted) in a pid namespace whose pid 1 is
#             in the host's cgroup namespace, with CAP_SYS_ADMIN: the root learned by setns; the quota binds
#   none      the container's view without CAP_SYS_ADMIN: status says "unresolved", the client has no cgroup,
#             the quota does not bind (what docs/kubernetes.md describes), pinctl doctor warns; the daemon
#             logs why
#   partial   the container's view without CAP_SYS_ADMIN, and only D's parent's subtree of the host's tree
#             mounted in (its root climbs one level, pid 1's path more): no host tree, so still "unresolved"
#             (not D's path without its prefix), and the daemon logs why
# usage: run-cgroupns.py SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import deploycheck as dc  # tests/deploy, beside this script
from deploycheck import fail, ok, skip

MIB = 1 << 20


SRC, BUILD = sys.argv[1], sys.argv[2]
PINBROKERD = os.path.join(BUILD, "daemon/pinbrokerd")
PINCTL = os.path.join(BUILD, "client/pinctl")
if os.geteuid() != 0:
    skip("needs root: cgroups are made and processes moved between them")
dc.require_built(PINBROKERD, PINCTL)
for tool in ("unshare", "setpriv", "nsenter"):
    if not shutil.which(tool):
        skip(f"no {tool} (apt-get install util-linux)")


def own_cgroup():
    """(v1 memory?, our path in that hierarchy, its mount point): the hierarchy clients are charged in, as
    jobs_parse_proc_cgroup picks it (v1's memory controller where there is one, else the unified one)."""
    lines = open("/proc/self/cgroup").read().splitlines()
    mem = [ln.split(":", 2)[2] for ln in lines if "memory" in ln.split(":", 2)[1].split(",")]
    uni = [ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")]
    v1 = bool(mem)
    path = mem[0] if v1 else (uni[0] if uni else None)
    if path is None:
        skip("no memory or unified line in /proc/self/cgroup")
    for ln in open("/proc/self/mountinfo"):
        pre, post = ln.split(" - ", 1)
        f, fs = pre.split(), post.split()
        if f[3] != "/":
            continue
        if (v1 and fs[0] == "cgroup" and "memory" in fs[2].split(",")) or (not v1 and fs[0] == "cgroup2"):
            return v1, path, f[4]
    skip(f"no {'v1 memory' if v1 else 'cgroup2'} hierarchy mounted at its root in /proc/self/mountinfo")


V1, MY_CG, MNT = own_cgroup()
NAME = f"pinbroker-cgns-{os.getpid()}"
BASE_HOST = (MY_CG.rstrip("/") + "/" + NAME) if MY_CG != "/" else "/" + NAME  # as the host names it
BASE = MNT + BASE_HOST
try:
    os.mkdir(BASE)
except OSError as e:
    skip(f"cannot make a cgroup under {MNT}{MY_CG} ({e.strerror}): the cgroup tree is not writable here")

T = tempfile.mkdtemp(prefix="pinbroker-cgns.")
os.chmod(T, 0o755)
SOCK = os.path.join(T, "pinbroker.sock")
CONF = os.path.join(T, "pinbrokerd.conf")
with open(CONF, "w") as f:
    f.write(f"socket = {SOCK}\nbudget = 64M\nprewarm = 4M\nhugetlb = no\nnuma = no\n")
procs = []
logs = []


def cleanup():
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
    # Children first; a cgroup still holding a process (it just died) takes a moment to empty.
    for _ in range(50):
        for d in sorted((os.path.join(r, x) for r, ds, _ in os.walk(BASE) for x in ds), key=len, reverse=True):
            try:
                os.rmdir(d)
            except OSError:
                pass
        try:
            os.rmdir(BASE)
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(T, ignore_errors=True)


def dump_logs():
    for p in logs:
        try:
            print(f"--- {p}\n{open(p).read()[-4000:]}")
        except OSError:
            pass


dc.fail_hooks.append(dump_logs)

# What runs pinctl where the daemon sees it as the host's root: its pid namespace (root is an admin only from the
# daemon's own namespaces; the setns way's daemon has one of its own). Set by start_daemon.
admin_prefix = ()


def env_for(prefix):
    """The environment of a command run under prefix. nsenter --pid leaves /proc the host's, where the
    process's own pid names another process: LeakSanitizer (an ASan build's pinctl) then cannot read its own
    threads and aborts, so leak checks are off there; they run in every other pinctl of the suite."""
    if not prefix:
        return None
    return dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")


def pinctl(*args, check=True, prefix=None):
    prefix = admin_prefix if prefix is None else prefix
    r = subprocess.run([*prefix, PINCTL, "--socket", SOCK, *args], capture_output=True, text=True, timeout=30,
                       env=env_for(prefix))
    if check and r.returncode != 0:
        fail(f"pinctl {' '.join(args)}: exit {r.returncode}: {r.stdout}{r.stderr}")
    return r


def wait_for(what, fn, timeout_s=20):
    return dc.wait_for(what, fn, timeout_s)


def mkcg(name):
    os.mkdir(f"{BASE}/{name}")
    return f"{BASE_HOST}/{name}"


def remount_own(mnt):
    """Shell lines that give a new mount namespace a container's view: the host's hierarchy unmounted, the
    cgroup namespace's own mounted in its place (its root is the namespace's)."""
    fs = "-t cgroup -o memory cgroup" if V1 else "-t cgroup2 cgroup2"
    return f"mount --make-rprivate / && umount -l {mnt} && mount {fs} {mnt} && "


def start_daemon(way, dcg, log):
    """pinbrokerd moved into dcg's directory, in its own cgroup namespace. Returns (the Popen, the prefix
    that runs a command where the daemon sees its pid: nsenter into the setns way's pid namespace)."""
    global admin_prefix
    admin_prefix = ()
    logs.append(log)
    cap = "setpriv --bounding-set -sys_admin " if way != "setns" else ""
    # partial: only a subtree of the host's tree mounted in (a hostPath of .../kubepods.slice, not of
    # /sys/fs/cgroup): the daemon's namespace root's parent, bound before the host's hierarchy is unmounted.
    part = (f"mount --make-rprivate / && mount --bind {MNT}{os.path.dirname(dcg)} {T}/part && "
            if way == "partial" else "")
    inner = (f"{part}{remount_own(MNT) if way != 'mount' else ''}"
             f"exec {cap}{PINBROKERD} --config {CONF} --log-level debug")
    script = os.path.join(T, f"daemon-{way}.sh")
    with open(script, "w") as f:
        f.write(f"echo $$ > {MNT}{dcg}/cgroup.procs && exec unshare --cgroup --mount sh -c '{inner}'\n")
    if way == "setns":
        # pid 1 of a new pid namespace stays in this host's cgroup namespace: its /proc/1/ns/cgroup is the
        # setns target, and the daemon may open it (same uid and capabilities).
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", f"sh {script} & exec sleep 1000"]
    else:
        cmd = ["sh", script]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    procs.append(p)
    wait_for("pinbrokerd answering", lambda: p.poll() is None and pinctl("status", check=False).returncode == 0)
    prefix = ()
    if way == "setns":
        # Clients must share the daemon's pid namespace (SO_PEERCRED reads 0 for a pid outside it): its pid 1
        # is unshare's child.
        kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        if len(kids) != 1:
            fail(f"setns: unshare --fork has children {kids}")
        prefix = ("nsenter", "--target", kids[0], "--pid")
    admin_prefix = prefix
    return p, prefix


def stop(p):
    os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    procs.remove(p)


def in_cgroup(cg, args, prefix=()):
    """pinctl ARGS run by a process in cg (moved there before it execs pinctl)."""
    sh = f"echo $$ > {MNT}{cg}/cgroup.procs && exec {PINCTL} --socket {SOCK} {args}"
    return subprocess.run([*prefix, "sh", "-c", sh], capture_output=True, text=True, timeout=30,
                          env=env_for(prefix))


def holder(cg, size, prefix=()):
    """A client in cg holding a lease until killed; returns it once the daemon lists its lease."""
    sh = f"echo $$ > {MNT}{cg}/cgroup.procs && exec {PINCTL} --socket {SOCK} acquire {size} --hold 600 --label cgns"
    p = subprocess.Popen([*prefix, "sh", "-c", sh], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=env_for(prefix))
    procs.append(p)
    wait_for("the holder's lease", lambda: any(l.get("label") == "cgns" for l in status()["leases"]))
    return p


def status():
    return json.loads(pinctl("status", "--json").stdout)


def quota_binds(way, ccg, prefix, expect_cgroup):
    pinctl("quota", "set", ccg, "8M")
    r = in_cgroup(ccg, "acquire 16M", prefix)
    if r.returncode == 0 or "quota" not in (r.stdout + r.stderr).lower():
        fail(f"{way}: a 16M acquire in {ccg} (quota 8M) was not refused for the quota: exit {r.returncode}: "
             f"{r.stdout}{r.stderr}")
    why = [ln for ln in (r.stdout + r.stderr).splitlines() if "quota" in ln.lower()][0].strip()
    ok(f"{way}: a 16M acquire in the client's cgroup is refused against its 8M quota: {why}")
    h = holder(ccg, "4M", prefix)
    st = status()
    rows = [c for c in st["clients"] if c["leases"]]
    if [c["cgroup"] for c in rows] != [expect_cgroup]:
        fail(f"{way}: the holder's client row names cgroup {[c['cgroup'] for c in rows]}, not {expect_cgroup}")
    jobs = {j["job"]: j for j in st["jobs"]}
    if jobs.get(ccg, {}).get("quota_bytes") != 8 * MIB or jobs[ccg].get("bytes") != 4 * MIB:
        fail(f"{way}: status jobs {st['jobs']}: want {ccg} with 4 MiB of an 8 MiB quota")
    metrics = pinctl("metrics").stdout
    want = f'pinbroker_job_leased_bytes{{cgroup="{ccg}"}} {4 * MIB}'
    if want not in metrics:
        fail(f"{way}: metrics lack {want}:\n" + "\n".join(ln for ln in metrics.splitlines() if "cgroup=" in ln))
    ok(f"{way}: a 4M lease granted; status, jobs and metrics name the client's host cgroup {ccg}")
    return h


try:
    # ---------------------------------------------------------------- mount
    dcg, ccg = mkcg("mount-daemon"), mkcg("mount-client")
    d, pre = start_daemon("mount", dcg, os.path.join(T, "mount.log"))
    st = status()
    if st.get("cgroup_namespace") != "private" or st.get("cgroup_ns_root") != dcg:
        fail(f"mount: status cgroup_namespace {st.get('cgroup_namespace')!r}, cgroup_ns_root "
             f"{st.get('cgroup_ns_root')!r}: want 'private' and {dcg}")
    ok(f"mount: status says the daemon's namespace is its own, rooted at {dcg}")
    if "found in the host's tree mounted at " + MNT not in open(os.path.join(T, "mount.log")).read():
        fail("mount: the daemon's log does not say it found itself in the host tree mount")
    h = quota_binds("mount", ccg, pre, ccg)
    # The rule is seen through the host tree, and released once the client's cgroup is gone.
    wait_for("the rule seen", lambda: {r["pattern"]: r for r in
                                       json.loads(pinctl("quota", "list", "--json").stdout)["rules"]}
             .get(ccg, {}).get("seen"), timeout_s=15)
    os.killpg(h.pid, signal.SIGKILL)
    h.wait()
    procs.remove(h)
    wait_for("the client's cgroup empty", lambda: not open(f"{MNT}{ccg}/cgroup.procs").read().strip())
    os.rmdir(MNT + ccg)
    wait_for("the rule released", lambda: ccg not in json.dumps(json.loads(
        pinctl("quota", "list", "--json").stdout)["rules"]), timeout_s=20)
    ok("mount: the rule was seen through the host tree and released once the client's cgroup was removed")
    r = pinctl("doctor", "--json", check=False)
    if '{"check":"cgroup-namespace","status":"ok"' not in r.stdout:
        fail(f"mount: doctor's cgroup-namespace check is not ok: {r.stdout}")
    stop(d)

    # ---------------------------------------------------------------- setns
    dcg, ccg = mkcg("setns-daemon"), mkcg("setns-client")
    d, pre = start_daemon("setns", dcg, os.path.join(T, "setns.log"))
    st = status()
    if st.get("cgroup_namespace") != "private" or st.get("cgroup_ns_root") != dcg:
        log = open(os.path.join(T, "setns.log")).read()
        if "no setns into pid 1's" in log and "Permission denied" in log:
            fail(f"setns: the daemon could not open its pid 1's cgroup namespace here:\n{log}")
        fail(f"setns: status cgroup_namespace {st.get('cgroup_namespace')!r}, cgroup_ns_root "
             f"{st.get('cgroup_ns_root')!r}: want 'private' and {dcg}")
    if "setns into pid 1's cgroup namespace" not in open(os.path.join(T, "setns.log")).read():
        fail("setns: the daemon's log does not say the root came from setns")
    ok(f"setns: the host tree unmounted, the root {dcg} learned by setns into pid 1's namespace")
    h = quota_binds("setns", ccg, pre, ccg)
    stop(d)
    os.killpg(h.pid, signal.SIGKILL)
    h.wait()
    procs.remove(h)

    # ---------------------------------------------------------------- none
    dcg, ccg = mkcg("none-daemon"), mkcg("none-client")
    d, pre = start_daemon("none", dcg, os.path.join(T, "none.log"))
    st = status()
    if st.get("cgroup_namespace") != "unresolved" or st.get("cgroup_ns_root") is not None:
        fail(f"none: status cgroup_namespace {st.get('cgroup_namespace')!r}, cgroup_ns_root "
             f"{st.get('cgroup_ns_root')!r}: want 'unresolved' and null")
    if "where it sits in the host's tree is unknown" not in open(os.path.join(T, "none.log")).read():
        fail("none: the daemon did not warn that it could not place its namespace")
    ok("none: no host tree and no CAP_SYS_ADMIN: status says unresolved, and the daemon warned")
    pinctl("quota", "set", ccg, "8M")
    # Its job cannot be told while rules exist: job-unknown = refuse (the default) refuses it, so no job is
    # silently unlimited (issue 38); job-unknown = allow charges it to no job, unbound by its rule.
    r = in_cgroup(ccg, "acquire 16M", pre)
    if r.returncode == 0 or "job-unknown" not in r.stdout + r.stderr:
        fail(f"none: a 16M acquire of a client whose cgroup the daemon cannot name was not refused under "
             f"job-unknown = refuse (exit {r.returncode}): {r.stdout}{r.stderr}")
    ok("none: the client outside the namespace, its job unknown while rules exist, is refused (job-unknown)")
    pinctl("set", "job-unknown", "allow")
    r = in_cgroup(ccg, "acquire 16M", pre)
    if r.returncode != 0:
        fail(f"none: under job-unknown = allow a 16M acquire was refused: {r.stdout}{r.stderr}")
    ok("none: under job-unknown = allow it is charged to no job, so its quota does not bind (as documented)")
    r = pinctl("doctor", "--json", check=False)
    if r.returncode == 0 or '{"check":"cgroup-namespace","status":"warn"' not in r.stdout:
        fail(f"none: doctor exit {r.returncode}, want a cgroup-namespace warning and not 0: {r.stdout}")
    ok(f"none: pinctl doctor warns (cgroup-namespace) and exits {r.returncode}")
    r = pinctl("status", check=False)
    if "unresolved" not in r.stdout:
        fail(f"none: pinctl status does not say the namespace is unresolved:\n{r.stdout}")
    stop(d)

    # ---------------------------------------------------------------- partial
    dcg = mkcg("partial-daemon")
    os.mkdir(os.path.join(T, "part"))
    d, pre = start_daemon("partial", dcg, os.path.join(T, "partial.log"))
    st = status()
    log = open(os.path.join(T, "partial.log")).read()
    if st.get("cgroup_namespace") != "unresolved" or st.get("cgroup_ns_root") is not None:
        fail(f"partial: status cgroup_namespace {st.get('cgroup_namespace')!r}, cgroup_ns_root "
             f"{st.get('cgroup_ns_root')!r}: want 'unresolved' and null (the mount is a subtree, not the "
             f"host's root):\n{log}")
    if "a subtree of the host's, not its root" not in log:
        fail(f"partial: the daemon's log does not say why the mount was not taken:\n{log}")
    ok("partial: a mount of a subtree of the host's tree is not taken for its root: unresolved, and logged why")
    stop(d)
    print("PASS")
finally:
    cleanup()
