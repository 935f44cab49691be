# SPDX-License-Identifier: MIT
"""What tests/deploy's Python scripts share: their verdicts (ok; fail, which ends the run; check, which counts
failures until exit_status), skip (exit 77), waiting on a condition with a bound, python3's gRPC packages, a
script's scratch folder with the daemon it runs (Harness), and a real pod cgroup of this host.
Each script imports it from its own folder: `import deploycheck as dc`."""
import functools
import os
import subprocess
import sys
import time

failures = []
fail_hooks = []  # called before fail() exits (a script's log dump)


def ok(msg):
    print(f"ok: {msg}")


def fail(msg):
    print(f"FAIL: {msg}")
    for hook in fail_hooks:
        hook()
    sys.exit(1)


def skip(msg):
    print(f"SKIP: {msg}")
    sys.exit(77)


def check(cond, what):
    """A verdict that lets the run go on: counted in failures when cond is false. Returns cond."""
    print(("ok: " if cond else "FAIL: ") + what, file=sys.stdout if cond else sys.stderr)
    if not cond:
        failures.append(what)
    return cond


def exit_status():
    return 1 if failures else 0


def wait_for(what, fn, timeout_s=10.0, step_s=0.05, must=True):
    """fn() until it returns something true: that value. After timeout_s, fail (must), else None."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(step_s)
    if must:
        fail(f"{what}: not within {timeout_s} s")
    print(f"timed out waiting for {what}", file=sys.stderr)
    return None


def require_grpc():
    """The grpc module, with grpc_tools there for the stubs; skips without them."""
    try:
        import grpc
        from grpc_tools import protoc  # noqa: F401 (python3-grpc-tools, for the stubs)
    except ImportError:
        # ctest runs the first python3 on PATH; Debian's has the packages where another may not.
        if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3") and not os.environ.get("PB_REEXEC"):
            os.environ["PB_REEXEC"] = "1"
            os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
        skip("python3 grpc or grpc_tools not found (apt-get install python3-grpcio python3-grpc-tools)")
    return grpc


def require_built(*paths):
    """Fail unless each of paths is an executable of the build."""
    for f in paths:
        if not os.access(f, os.X_OK):
            fail(f"no {f}: build first")


def cleanup(tmp, procs, cgroups=()):
    """Kill what procs still runs, remove the cgroups (innermost last in the list) and the scratch folder tmp."""
    import shutil

    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for d in reversed(cgroups):
        try:
            os.rmdir(d)
        except OSError:
            pass
    shutil.rmtree(tmp, ignore_errors=True)


def scratch(prefix):
    """A scratch folder others may enter (the daemon's socket folder is in it)."""
    import tempfile

    tmp = tempfile.mkdtemp(prefix=prefix)
    os.chmod(tmp, 0o755)
    return tmp


def compile_stubs(src, folder, protos, tmp):
    """The gRPC stubs of folder's protos (names without .proto), generated into tmp/stubs by the code the image
    build runs and made importable; returns that folder."""
    stubs = os.path.join(tmp, "stubs")
    os.mkdir(stubs)
    sys.path.insert(0, os.path.join(src, "deploy/kubernetes/lib"))
    import pinbroker_k8s

    try:
        pinbroker_k8s.compile_protos([os.path.join(folder, p + ".proto") for p in protos], stubs)
    except RuntimeError as e:
        fail(str(e))
    sys.path.insert(0, stubs)
    return stubs


class Daemon:
    """pinbrokerd from a config file in tmp (its budget rewritten by write_conf), its socket in tmp/run, and pinctl
    against it; the processes it starts go on procs."""

    def __init__(self, tmp, pinbrokerd, pinctl, procs, wait=wait_for):
        self.tmp, self.pinbrokerd, self.pinctl_path, self.procs, self.wait = tmp, pinbrokerd, pinctl, procs, wait
        self.run = os.path.join(tmp, "run")
        os.mkdir(self.run, 0o755)
        self.sock = os.path.join(self.run, "pinbroker.sock")
        self.conf = os.path.join(tmp, "pinbrokerd.conf")

    def write_conf(self, budget):
        with open(self.conf, "w") as f:
            f.write(f"socket = {self.sock}\nbudget = {budget}\nprewarm = 4M\nhugetlb = no\n")
        os.chmod(self.conf, 0o600)

    def pinctl(self, *args, check=True):
        import subprocess

        r = subprocess.run([self.pinctl_path, "--socket", self.sock, *args], capture_output=True, text=True, timeout=20)
        if check and r.returncode != 0:
            fail(f"pinctl {' '.join(args)}: exit {r.returncode}: {r.stderr}")
        return r

    def start(self):
        import subprocess

        p = subprocess.Popen([self.pinbrokerd, "--config", self.conf], stdin=subprocess.DEVNULL,
                             stdout=open(os.path.join(self.tmp, "daemon.log"), "a"), stderr=subprocess.STDOUT)
        self.procs.append(p)
        self.wait("pinbrokerd answering", lambda: self.pinctl("status", check=False).returncode == 0)
        return p

    def rules(self):
        import json

        return {r["pattern"]: r["bytes"] for r in json.loads(self.pinctl("quota", "list", "--json").stdout)["rules"]}


class Harness:
    """A script's set-up: the build's pinbrokerd and pinctl (which must be built), a scratch folder (tmp), the
    processes and cgroups cleanup() ends and removes, wait_for with the script's bound, and the Daemon it runs."""

    def __init__(self, prefix, build, timeout_s):
        self.pinbrokerd = os.path.join(build, "daemon/pinbrokerd")
        self.pinctl = os.path.join(build, "client/pinctl")
        require_built(self.pinbrokerd, self.pinctl)
        self.tmp = scratch(prefix)
        self.procs, self.cgroups = [], []
        self.wait_for = functools.partial(wait_for, timeout_s=timeout_s)
        self.daemon = Daemon(self.tmp, self.pinbrokerd, self.pinctl, self.procs, self.wait_for)

    def cleanup(self):
        cleanup(self.tmp, self.procs, self.cgroups)


def make_pod_cgroup(slice_name, uid, made):
    """A real pod cgroup of this host as the systemd driver names it, SLICE.slice/SLICE-podUID.slice (under v1's
    memory controller where there is one): (base, rel), each folder made appended to made. None, with a note, where
    this host lets none be made."""
    base = "/sys/fs/cgroup/memory" if os.path.isdir("/sys/fs/cgroup/memory") else "/sys/fs/cgroup"
    rel = f"/{slice_name}.slice/{slice_name}-pod" + uid.replace("-", "_") + ".slice"
    try:
        os.mkdir(base + rel.rsplit("/", 1)[0])
        made.append(base + rel.rsplit("/", 1)[0])
        os.mkdir(base + rel)
        made.append(base + rel)
    except OSError as e:
        print(f"note: cannot make a cgroup under {base} ({e}): the real-cgroup check did not run")
        return None
    return base, rel


def acquire_in_cgroup(pinctl, sock, cgroup, rel, size, refused, limit):
    """pinctl acquire SIZE from a shell moved into the cgroup folder cgroup: refused with words naming rel's quota
    (refused), else granted; fail otherwise (limit says what bounds the cgroup). Returns the refusal's line."""
    sh = f"echo $$ > {cgroup}/cgroup.procs && exec {pinctl} --socket {sock} acquire {size}"
    r = subprocess.run(["sh", "-c", sh], capture_output=True, text=True, timeout=60)
    msg = [ln for ln in (r.stdout + r.stderr).splitlines() if rel in ln and "quota" in ln]
    if refused and (r.returncode == 0 or not msg):
        fail(f"a {size} acquire in the pod's cgroup ({limit}): exit {r.returncode}: {r.stdout}{r.stderr}")
    if not refused and r.returncode != 0:
        fail(f"a {size} acquire in the pod's cgroup ({limit}) failed: {r.stdout}{r.stderr}")
    return msg[0].strip() if msg else None
