#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Checks on the rendered kustomize output (kubectl kustomize deploy/kubernetes) that matter for
# pinbrokerd: the privileges it gets and no more, the socket's hostPath, the patcher's token and
# RBAC, the config the daemon will read (handed to the real pinbrokerd --check-config), probes,
# QoS and the client example. Prints one line per failure; exit 0 all passed, 1 any failed.
# usage: check-manifests.py BASE.yaml OVERLAY.yaml CLIENT-POD.yaml PINBROKERD PATCHER.sh
import os
import re
import subprocess
import sys
import tempfile

import yaml

SOCK_DIR = "/run/pinbroker"
SOCK = SOCK_DIR + "/pinbroker.sock"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DAEMON_CAPS = {"IPC_LOCK", "SYS_RESOURCE", "KILL"}  # systemd/pinbrokerd.service's three
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind, where):
    found = [d for d in docs if d.get("kind") == kind]
    check(len(found) == 1, f"{where}: {len(found)} {kind} objects, expected 1")
    return found[0] if found else {}


def qty_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|K|M|G|T)?", str(q))
    if not m:
        return None
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[m.group(2)]
    return int(m.group(1)) * mult


def conf_value(text, key):
    val = None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line and line.split("=", 1)[0].strip() == key:
            val = line.split("=", 1)[1].strip()
    return val


def check_rendered(docs, where, pinbrokerd, patcher_src):
    kinds = sorted(d["kind"] for d in docs)
    for k in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"):
        check(k in kinds, f"{where}: no {k} (kinds: {kinds})")
    ns = one(docs, "Namespace", where).get("metadata", {}).get("name")
    for d in docs:
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            check(d["metadata"].get("namespace") == ns,
                  f"{where}: {d['kind']}/{d['metadata']['name']} is not in namespace {ns}")

    # RBAC: get on nodes, patch on nodes/status, nothing else (no wildcards, no other verbs).
    role = one(docs, "ClusterRole", where)
    grants = set()
    for rule in role.get("rules", []):
        check(rule.get("apiGroups") == [""], f"{where}: ClusterRole rule outside the core group: {rule}")
        check(not rule.get("resourceNames") and not rule.get("nonResourceURLs"), f"{where}: unexpected rule {rule}")
        for res in rule.get("resources", []):
            for verb in rule.get("verbs", []):
                grants.add((res, verb))
    check(grants == {("nodes", "get"), ("nodes/status", "patch")},
          f"{where}: ClusterRole grants {sorted(grants)}, expected get nodes and patch nodes/status only")
    sa = one(docs, "ServiceAccount", where)
    binding = one(docs, "ClusterRoleBinding", where)
    check(binding.get("roleRef", {}).get("name") == role["metadata"]["name"] and
          binding.get("roleRef", {}).get("kind") == "ClusterRole",
          f"{where}: the ClusterRoleBinding does not bind the ClusterRole")
    check(binding.get("subjects") == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": ns}],
          f"{where}: the ClusterRoleBinding's subjects are {binding.get('subjects')}")
    check(sa.get("automountServiceAccountToken") is False, f"{where}: the ServiceAccount automounts its token")

    ds = one(docs, "DaemonSet", where)
    spec = ds.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    check(spec.get("updateStrategy", {}).get("type") in ("OnDelete", "RollingUpdate"),
          f"{where}: DaemonSet has no updateStrategy")
    check(spec.get("selector", {}).get("matchLabels", {}).items() <=
          spec.get("template", {}).get("metadata", {}).get("labels", {}).items(),
          f"{where}: the selector does not match the pod template's labels")
    check(pod.get("hostPID") is True, f"{where}: hostPID is not true (peer pids would read 0: docs/kubernetes.md)")
    check(not pod.get("hostNetwork") and not pod.get("hostIPC"), f"{where}: hostNetwork or hostIPC set")
    check(pod.get("serviceAccountName") == sa["metadata"]["name"], f"{where}: the pod does not run as the ServiceAccount")
    check(pod.get("automountServiceAccountToken") is False, f"{where}: the pod automounts a token into every container")
    check(pod.get("nodeSelector"), f"{where}: no nodeSelector")
    check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
          f"{where}: no toleration for the nvidia.com/gpu taint")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    sock_vols = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == SOCK_DIR]
    check(len(sock_vols) == 1, f"{where}: no hostPath volume for {SOCK_DIR}")
    check(all(n in sock_vols or "hostPath" not in v for n, v in vols.items()),
          f"{where}: hostPath volumes other than {SOCK_DIR}")
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    containers = {c["name"]: c for c in pod.get("containers", [])}
    check(set(containers) == {"pinbrokerd", "node-patcher"}, f"{where}: containers {sorted(containers)}")
    daemon = containers.get("pinbrokerd", {})
    patcher = containers.get("node-patcher", {})

    def mounts(c):
        return {m["mountPath"]: m for m in c.get("volumeMounts", [])}

    def mounted_cm(c, path):
        m = mounts(c).get(path)
        v = vols.get(m["name"], {}) if m else {}
        return cms.get(v.get("configMap", {}).get("name"))

    for c in (daemon, patcher):
        sc = c.get("securityContext", {})
        name = c.get("name")
        check(not sc.get("privileged"), f"{where}: container {name} is privileged")
        check(sc.get("allowPrivilegeEscalation") is False, f"{where}: container {name} allows privilege escalation")
        check(sc.get("readOnlyRootFilesystem") is True, f"{where}: container {name} has a writable root filesystem")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: container {name} does not drop ALL capabilities")
        m = mounts(c).get(SOCK_DIR)
        check(m is not None and m["name"] in sock_vols, f"{where}: container {name} does not mount {SOCK_DIR}")
        # Guaranteed QoS needs requests == limits for cpu and memory in every container.
        res = c.get("resources", {})
        for r in ("cpu", "memory"):
            check(r in res.get("requests", {}) and res.get("requests", {}).get(r) == res.get("limits", {}).get(r),
                  f"{where}: container {name}: {r} request {res.get('requests', {}).get(r)} != limit "
                  f"{res.get('limits', {}).get(r)} (not Guaranteed QoS)")
    # The daemon: exactly the unit's capabilities; memlock comes from CAP_IPC_LOCK (the kernel
    # skips RLIMIT_MEMLOCK for it; a pod spec has no ulimit field).
    caps = set(daemon.get("securityContext", {}).get("capabilities", {}).get("add", []))
    check("IPC_LOCK" in caps, f"{where}: pinbrokerd lacks CAP_IPC_LOCK (it cannot lock the pool)")
    check(caps == DAEMON_CAPS, f"{where}: pinbrokerd adds {sorted(caps)}, expected {sorted(DAEMON_CAPS)}")
    check(patcher.get("securityContext", {}).get("capabilities", {}).get("add") in (None, []),
          f"{where}: node-patcher adds capabilities")
    check(patcher.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: node-patcher may run as root")
    check(mounts(patcher).get(SOCK_DIR, {}).get("readOnly") is True, f"{where}: node-patcher mounts {SOCK_DIR} writable")
    check(TOKEN_DIR not in mounts(daemon), f"{where}: pinbrokerd gets the API token")
    tm = mounts(patcher).get(TOKEN_DIR)
    tv = vols.get(tm["name"], {}) if tm else {}
    srcs = tv.get("projected", {}).get("sources", [])
    check(any(s.get("serviceAccountToken", {}).get("path") == "token" for s in srcs) and
          any(i.get("path") == "ca.crt" for s in srcs for i in s.get("configMap", {}).get("items", [])),
          f"{where}: node-patcher has no projected token and ca.crt at {TOKEN_DIR}")
    env = {e["name"]: e for e in patcher.get("env", [])}
    check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
          f"{where}: node-patcher's NODE_NAME is not the downward API's spec.nodeName")
    check(env.get("PINBROKER_SOCKET", {}).get("value") == SOCK, f"{where}: node-patcher's PINBROKER_SOCKET is not {SOCK}")
    script_cm = mounted_cm(patcher, "/opt/pinbroker")
    check(script_cm is not None and script_cm.get("data", {}).get("node-patcher.sh") == patcher_src,
          f"{where}: the ConfigMap at /opt/pinbroker does not hold deploy/kubernetes/node-patcher.sh")
    check(patcher.get("command") == ["/bin/sh", "/opt/pinbroker/node-patcher.sh"], f"{where}: node-patcher's command")

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = daemon.get(probe, {}).get("exec", {}).get("command", [])
        check(len(cmd) >= 2 and cmd[0].endswith("pinctl") and "status" in cmd and SOCK in cmd,
              f"{where}: pinbrokerd's {probe} is not `pinctl --socket {SOCK} status`: {cmd}")

    # The config the daemon reads: valid for the real daemon, the socket in the hostPath, and a
    # budget the memory limit can hold with room above the tight threshold.
    cmd = daemon.get("command", [])
    check(cmd[:1] == ["/usr/sbin/pinbrokerd"] and "--config" in cmd, f"{where}: pinbrokerd's command is {cmd}")
    conf_path = cmd[cmd.index("--config") + 1] if "--config" in cmd[:-1] else ""
    conf_cm = mounted_cm(daemon, os.path.dirname(conf_path))
    conf = conf_cm.get("data", {}).get(os.path.basename(conf_path)) if conf_cm else None
    if check(conf is not None, f"{where}: {conf_path} is not in a ConfigMap mounted into pinbrokerd"):
        check(conf_value(conf, "socket") == SOCK, f"{where}: the config's socket is {conf_value(conf, 'socket')}, not {SOCK}")
        with tempfile.NamedTemporaryFile("w", suffix=".conf") as f:
            f.write(conf)
            f.flush()
            os.chmod(f.name, 0o600)
            r = subprocess.run([pinbrokerd, "--config", f.name, "--check-config"], capture_output=True, text=True)
            check(r.returncode == 0, f"{where}: pinbrokerd --check-config refuses the ConfigMap's config:\n{r.stdout}{r.stderr}")
        limit = qty_bytes(daemon.get("resources", {}).get("limits", {}).get("memory"))
        budget = conf_value(conf, "budget") or "25%"
        if check(limit is not None, f"{where}: pinbrokerd has no memory limit"):
            if budget.endswith("%"):
                b = limit * float(budget[:-1]) / 100
            else:
                m = re.fullmatch(r"(\d+)([KMGT]?)", budget)
                b = int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)] if m else None
            # The pool is charged to this container: it must fit, with more than 10% of the limit
            # (tight-mem-available-pct) left, or the daemon calls its own cgroup tight.
            check(b is not None and b <= 0.85 * limit,
                  f"{where}: budget {budget} is over 85% of the memory limit {limit} bytes (the pool is charged to it)")
    return ds, conf


def check_client(docs, where):
    pod = one(docs, "Pod", where)
    spec = pod.get("spec", {})
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    check(not spec.get("hostPID"), f"{where}: the client needs no hostPID")
    for c in spec.get("containers", []):
        name = c.get("name")
        lim = c.get("resources", {}).get("limits", {})
        check("pinbroker.io/pinned-gib" in lim, f"{where}: container {name} does not request pinbroker.io/pinned-gib")
        check(str(lim.get("pinbroker.io/pinned-gib", "x")).isdigit(), f"{where}: pinned-gib must be a whole number")
        m = [m for m in c.get("volumeMounts", []) if m["mountPath"] == SOCK_DIR]
        check(m and vols.get(m[0]["name"], {}).get("hostPath", {}).get("path") == SOCK_DIR,
              f"{where}: container {name} does not mount the node's {SOCK_DIR}")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check(env.get("PINBROKER_SOCKET") == SOCK, f"{where}: container {name}'s PINBROKER_SOCKET is not {SOCK}")
        check(not c.get("securityContext", {}).get("capabilities", {}).get("add"), f"{where}: the client adds capabilities")


def pod_of(docs):
    return [d for d in docs if d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]


def daemon_of(docs):
    return [c for c in pod_of(docs)["containers"] if c["name"] == "pinbrokerd"][0]


# Each breaks one thing the checks are for; every one must be caught, so the checks can fail.
MUTATIONS = {
    "no IPC_LOCK": lambda d: daemon_of(d)["securityContext"]["capabilities"]["add"].remove("IPC_LOCK"),
    "privileged": lambda d: daemon_of(d)["securityContext"].update(privileged=True),
    "SYS_ADMIN": lambda d: daemon_of(d)["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"),
    "no hostPID": lambda d: pod_of(d).pop("hostPID"),
    "socket elsewhere": lambda d: [v["hostPath"].update(path="/var/run/pb") for v in pod_of(d)["volumes"] if "hostPath" in v],
    "RBAC list": lambda d: [r["verbs"].append("list") for x in d if x["kind"] == "ClusterRole" for r in x["rules"]],
    "RBAC nodes patch": lambda d: [x["rules"].append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]})
                                   for x in d if x["kind"] == "ClusterRole"],
    "token in every container": lambda d: pod_of(d).pop("automountServiceAccountToken"),
    "budget over the limit": lambda d: [x["data"].update({"pinbrokerd.conf": x["data"]["pinbrokerd.conf"].replace("budget = 75%", "budget = 95%")})
                                        for x in d if x["kind"] == "ConfigMap" and "pinbrokerd.conf" in x["data"]],
    "bad config key": lambda d: [x["data"].update({"pinbrokerd.conf": x["data"]["pinbrokerd.conf"] + "no-such-key = 1\n"})
                                 for x in d if x["kind"] == "ConfigMap" and "pinbrokerd.conf" in x["data"]],
    "burstable": lambda d: daemon_of(d)["resources"]["requests"].update(memory="1Gi"),
}


def self_test(base_path, pinbrokerd, patcher_src):
    global failures
    missed = []
    for name, mutate in MUTATIONS.items():
        docs = load(base_path)
        mutate(docs)
        failures = []
        check_rendered(docs, "mutated", pinbrokerd, patcher_src)
        print(f"self-test: {name}: {'caught: ' + failures[0].splitlines()[0] if failures else 'NOT CAUGHT'}")
        if not failures:
            missed.append(name)
    failures = [f"self-test: the checks did not catch '{m}'" for m in missed]


def main():
    base_path, overlay_path, client_path, pinbrokerd, patcher_path = sys.argv[1:6]
    with open(patcher_path) as f:
        patcher_src = f.read()
    self_test(base_path, pinbrokerd, patcher_src)
    base_ds, base_conf = check_rendered(load(base_path), "base", pinbrokerd, patcher_src)
    ov_ds, ov_conf = check_rendered(load(overlay_path), "overlay", pinbrokerd, patcher_src)
    lim = lambda ds: ds["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    check(lim(base_ds) != lim(ov_ds) and base_conf != ov_conf,
          "overlay: neither the memory limit nor the config differs from the base")
    check_client(load(client_path), "client pod")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
