#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# What pinbroker's two node agents on Kubernetes share (the device plugin, deploy/kubernetes/device-plugin, and
# the DRA driver, deploy/kubernetes/dra): gRPC stubs from the vendored kubelet protos, pinctl, and a pod's cgroup
# found by its UID in the host's cgroup tree. The image puts a copy of this file beside each agent.
#
# As a program it generates the stubs, as the image build does:
#   pinbroker_k8s.py gen-stubs OUT_DIR PROTO...
import os
import re
import subprocess
import sys
import tempfile

GIB = 1 << 30


def compile_protos(protos, out):
    """X_pb2.py and X_pb2_grpc.py in out for each X.proto of protos, with grpc_tools (python3-grpc-tools).
    Debian 12's grpc_tools (1.14) carries a protoc that predates proto3's `optional` keyword, which newer
    kubelet protos use on a few string fields (share_id): it compiles a copy without the keyword. The wire
    format is the same (the keyword only adds presence tracking, which nothing here reads)."""
    from grpc_tools import protoc  # python3-grpc-tools

    with tempfile.TemporaryDirectory(prefix="pinbroker-protos.") as tmp:
        names = []
        for p in protos:
            with open(p) as f:
                text = f.read()
            name = os.path.basename(p)
            with open(os.path.join(tmp, name), "w") as f:
                f.write(re.sub(r"(?m)^(\s*)optional\s+", r"\1", text))
            names.append(name)
        rc = protoc.main(["protoc", f"-I{tmp}", f"--python_out={out}", f"--grpc_python_out={out}",
                          *[os.path.join(tmp, n) for n in names]])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc could not compile {', '.join(protos)}")


def load_stubs(here, names, env_var):
    """{name: (name_pb2, name_pb2_grpc)} for each vendored name.proto in here: from the folder in env_var or
    here (the image generates them at build time), else generated now into a temp folder."""
    import importlib

    for d in (os.environ.get(env_var), here):
        if d and all(os.path.exists(os.path.join(d, n + "_pb2_grpc.py")) for n in names):
            break
    else:
        d = tempfile.mkdtemp(prefix="pinbroker-stubs.")
        compile_protos([os.path.join(here, n + ".proto") for n in names], d)
    if d not in sys.path:
        sys.path.insert(0, d)
    return {n: (importlib.import_module(n + "_pb2"), importlib.import_module(n + "_pb2_grpc")) for n in names}


def pinctl(binary, socket, *args, timeout=10):
    """Run pinctl; its stdout, or raise RuntimeError with its own message."""
    try:
        r = subprocess.run([binary, "--socket", socket, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"pinctl {' '.join(args)}: {e}") from None
    if r.returncode != 0:
        raise RuntimeError(f"pinctl {' '.join(args)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}")
    return r.stdout


def pod_cgroups(cgroup_root):
    """{pod UID with '_' for '-': the pod's cgroup path as the daemon names it}, from one walk of the
    kubepods tree (relative to the hierarchy's root: the v1 memory controller's on a v1 or hybrid
    host, else the unified one). The kubelet names a pod's cgroup pod<UID> (cgroupfs driver) or
    kubepods-<qos>-pod<UID with _>.slice (systemd driver), under kubepods (or, in some set-ups,
    kubelet.slice/kubelet-kubepods.slice)."""
    root = cgroup_root
    if os.path.isdir(os.path.join(root, "memory")):
        root = os.path.join(root, "memory")
    found = {}
    level = [""]
    for _ in range(4):  # kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/...-pod<UID>.slice
        nxt = []
        for rel in level:
            try:
                names = os.listdir(os.path.join(root, rel))
            except OSError:
                continue
            for n in names:
                p = os.path.join(rel, n)
                if not os.path.isdir(os.path.join(root, p)):
                    continue
                base = (n[:-6] if n.endswith(".slice") else n).replace("-", "_")
                i = base.rfind("pod")
                if i >= 0 and (i == 0 or base[i - 1] == "_") and len(base) - i - 3 >= 32:
                    found[base[i + 3:]] = "/" + p
                # Only the kubepods tree: a kube* slice or the cgroupfs driver's QoS folders.
                elif "kube" in n or n in ("burstable", "besteffort"):
                    nxt.append(p)
        level = nxt
    return found


def cgroup_key(uid):
    """A pod UID as pod_cgroups keys it."""
    return uid.replace("-", "_")


def quota_rules(binary, socket):
    """{pattern: bytes} of the daemon's quota rules (pinctl quota list --json); RuntimeError if it cannot say."""
    import json

    try:
        return {r["pattern"]: r["bytes"] for r in json.loads(pinctl(binary, socket, "quota", "list", "--json"))["rules"]}
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"pinctl quota list --json: unexpected answer: {e!r}") from None


class AgentConfig:
    """The settings both agents read from the environment, their own named PREFIX_... (DP_, DRA_): the daemon's
    socket and pinctl, the socket folder for client containers, the host's cgroup mount, the poll period and
    whether a quota that cannot be set fails the pod. ValueError for a bad one."""

    def __init__(self, env, prefix):
        self.socket = env.get("PINBROKER_SOCKET", "/run/pinbroker/pinbroker.sock")
        self.pinctl = env.get("PINCTL", "pinctl")
        self.sock_dir_host = env.get(prefix + "_SOCKET_DIR_HOST", "/run/pinbroker")
        self.sock_dir = env.get(prefix + "_SOCKET_DIR", "/run/pinbroker")
        self.cgroup_root = env.get(prefix + "_CGROUP_ROOT", "/sys/fs/cgroup")
        self.strict = env.get(prefix + "_STRICT", "0") == "1"
        poll = env.get(prefix + "_POLL_S", "10")
        try:
            self.poll_s = float(poll)
        except ValueError:
            self.poll_s = -1
        if self.poll_s <= 0:
            raise ValueError(f"{prefix}_POLL_S must be a number above 0, not {poll!r}")


def read_config(cls, log):
    """cls(os.environ), an AgentConfig; None with its ValueError logged (the agent exits 2)."""
    try:
        return cls(os.environ)
    except ValueError as e:
        log(str(e))
        return None


CGNS_WARNING = ("warning: pinbrokerd could not place its cgroup namespace in the host's tree, so the pod quotas set "
                "here do not bind: give its container the host's /sys/fs/cgroup read-only (docs/kubernetes.md, how "
                "the DaemonSet runs the daemon)")


def budget_status(binary, socket):
    """(budget_bytes, whether the daemon's cgroup namespace is unresolved: log CGNS_WARNING) from pinctl status
    --json; RuntimeError if the daemon cannot say."""
    import json

    try:
        st = json.loads(pinctl(binary, socket, "status", "--json"))
        return max(0, int(st["budget_bytes"])), st.get("cgroup_namespace") == "unresolved"
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"pinctl status --json: unexpected answer: {e!r}") from None


def set_pod_quota(binary, socket, rules, uid, path, want, what, log):
    """Make path's rule want bytes unless rules has it so already, logging "pod UID: quota WHAT for PATH". True
    when the rule is in place, False when pinctl failed (logged)."""
    if rules.get(path) == want:
        return True
    try:
        pinctl(binary, socket, "quota", "set", path, str(want))
        log(f"pod {uid}: quota {what} for {path}")
        return True
    except RuntimeError as e:
        log(f"pod {uid}: {e}")
        return False


def clear_pod_quota(binary, socket, rules, uid, path, why, log):
    """Clear path's rule if rules has one, for a pod that no longer needs it (why says so in the log)."""
    if path not in rules:
        return
    try:
        pinctl(binary, socket, "quota", "clear", path)
        log(f"pod {uid} {why}: quota of {path} cleared")
    except RuntimeError as e:
        log(f"pod {uid} {why}: {e}")


def stop_event():
    """A threading.Event that SIGTERM and SIGINT set: an agent's main loop runs until it is."""
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def poll_until(stop, period_s, one_round, log):
    """one_round() every period_s seconds until stop is set. A round that raises is logged: the poller must outlive
    any surprise, and the next round retries."""
    while not stop.is_set():
        try:
            one_round()
        except Exception as e:
            log(f"poll failed: {e!r}")
        stop.wait(period_s)


def unlink_quietly(*paths):
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def grpc_server(path, add):
    """A gRPC server on the Unix socket path (replacing a stale one), its services added by add(server), started."""
    import concurrent.futures

    import grpc

    unlink_quietly(path)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    add(server)
    server.add_insecure_port("unix://" + path)
    server.start()
    return server


def main(argv):
    if len(argv) >= 3 and argv[1] == "gen-stubs":
        os.makedirs(argv[2], exist_ok=True)
        compile_protos(argv[3:], argv[2])
        return 0
    print("usage: pinbroker_k8s.py gen-stubs OUT_DIR PROTO...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
