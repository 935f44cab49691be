#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Checks on the rendered kustomize output (kubectl kustomize deploy/kubernetes) that matter for
# pinbrokerd: the privileges it gets and no more, the socket's hostPath, the device plugin's
# folders (the base), the patcher's token and RBAC (deploy/overlays/node-patcher), the DRA driver's
# folders, token, RBAC and DeviceClass (deploy/overlays/dra), the metrics container and its scrape
# annotations, the image tag against the packages' version, the config the daemon will read (handed to
# the real pinbrokerd --check-config), probes, QoS, and the client examples: the device plugin's and the
# DRA one pass the restricted Pod Security level as far as a static check can tell.
# Prints one line per failure; exit 0 all passed, 1 any failed.
# usage: check-manifests.py BASE.yaml OVERLAY.yaml PATCHER-OVERLAY.yaml CLIENT-POD.yaml
#        CLIENT-POD-HOSTPATH.yaml PINBROKERD PATCHER.sh DRA-OVERLAY.yaml CLIENT-POD-DRA.yaml PODMONITOR.yaml
#        PACKAGE-VERSION
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
KUBELET_DP_DIR = "/var/lib/kubelet/device-plugins"
DAEMON_CGROUP_ROOT = "/host/sys/fs/cgroup"  # where the DaemonSet mounts the host's cgroup tree into pinbrokerd
PLUGIN_PATH = "/usr/lib/pinbroker/device-plugin/pinbroker-device-plugin.py"  # where the Containerfile puts it
RESOURCE = "pinbroker.io/pinned-gib"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
POD_LOGS_DIR = "/var/log/pods"
DRA_DRIVER = "pinned-memory.pinbroker.io"
DRA_PATH = "/usr/lib/pinbroker/dra/pinbroker-dra-driver.py"
DRA_HOST_PATHS = {"/var/lib/kubelet/plugins/" + DRA_DRIVER, "/var/lib/kubelet/plugins_registry", "/var/run/cdi"}
METRICS_PORT = 9464
LISTEN_EXEC = "/usr/lib/pinbroker/kubernetes/listen-exec.py"
METRICS_HTTP = "/usr/libexec/pinbroker-metrics-http"
VERSION = None  # the packages' version (debian/changelog), which the image tag must be
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


def check_rendered(docs, where, pinbrokerd, patcher_src, mode="plugin"):
    """mode: "plugin" (the base and large-budget: the device plugin beside the daemon, nothing
    talking to the API server), "patcher" (deploy/overlays/node-patcher) or "dra" (deploy/overlays/dra)."""
    kinds = sorted(d["kind"] for d in docs)
    api_kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    for k in ("Namespace", "DaemonSet") + (api_kinds if mode != "plugin" else ()) + (("DeviceClass",) if mode == "dra" else ()):
        check(k in kinds, f"{where}: no {k} (kinds: {kinds})")
    if mode == "plugin":
        check(not any(k in kinds for k in api_kinds), f"{where}: RBAC objects without an API client (kinds: {kinds})")
    ns = one(docs, "Namespace", where).get("metadata", {}).get("name")
    for d in docs:
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass"):
            check(d["metadata"].get("namespace") == ns,
                  f"{where}: {d['kind']}/{d['metadata']['name']} is not in namespace {ns}")
        else:
            check("namespace" not in d["metadata"], f"{where}: the cluster-scoped {d['kind']} has a namespace")

    if mode == "patcher":
        check_rbac(docs, where, ns, "", {("nodes", "get"), ("nodes/status", "patch")})
    if mode == "dra":
        check_rbac(docs, where, ns, "resource.k8s.io",
                   {("resourceslices", "get"), ("resourceslices", "create"), ("resourceslices", "update"),
                    ("resourceclaims", "get"), ("nodes", "get")})
        dc = one(docs, "DeviceClass", where)
        check(dc.get("apiVersion") == "resource.k8s.io/v1" and dc.get("metadata", {}).get("name") == DRA_DRIVER and
              [x.get("cel", {}).get("expression") for x in dc.get("spec", {}).get("selectors", [])]
              == [f'device.driver == "{DRA_DRIVER}"'],
              f"{where}: the DeviceClass does not select the devices of {DRA_DRIVER} (resource.k8s.io/v1)")
    return check_daemonset(docs, where, pinbrokerd, patcher_src, mode)


def check_rbac(docs, where, ns, group, expected):
    # RBAC: exactly the expected (resource, verb) grants (no wildcards, no other verbs); core resources in "",
    # the rest in group.
    role = one(docs, "ClusterRole", where)
    grants = set()
    for rule in role.get("rules", []):
        check(rule.get("apiGroups") in ([""], [group]), f"{where}: ClusterRole rule outside the expected groups: {rule}")
        check(not rule.get("resourceNames") and not rule.get("nonResourceURLs"), f"{where}: unexpected rule {rule}")
        for res in rule.get("resources", []):
            for verb in rule.get("verbs", []):
                check((res in ("nodes", "nodes/status")) == (rule.get("apiGroups") == [""]),
                      f"{where}: {res} granted in the wrong API group {rule.get('apiGroups')}")
                grants.add((res, verb))
    check(grants == expected, f"{where}: ClusterRole grants {sorted(grants)}, expected {sorted(expected)} only")
    sa = one(docs, "ServiceAccount", where)
    binding = one(docs, "ClusterRoleBinding", where)
    check(binding.get("roleRef", {}).get("name") == role["metadata"]["name"] and
          binding.get("roleRef", {}).get("kind") == "ClusterRole",
          f"{where}: the ClusterRoleBinding does not bind the ClusterRole")
    check(binding.get("subjects") == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": ns}],
          f"{where}: the ClusterRoleBinding's subjects are {binding.get('subjects')}")
    check(sa.get("automountServiceAccountToken") is False, f"{where}: the ServiceAccount automounts its token")


def check_daemonset(docs, where, pinbrokerd, patcher_src, mode):
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
    sas = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    if mode != "plugin":
        check(pod.get("serviceAccountName") in sas, f"{where}: the pod does not run as the ServiceAccount")
    check(pod.get("automountServiceAccountToken") is False, f"{where}: the pod automounts a token into every container")
    check(pod.get("nodeSelector"), f"{where}: no nodeSelector")
    check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
          f"{where}: no toleration for the nvidia.com/gpu taint")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    sock_vols = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == SOCK_DIR]
    check(len(sock_vols) == 1, f"{where}: no hostPath volume for {SOCK_DIR}")
    # The host's cgroup tree (read-only: the daemon's, to name clients' cgroups as the host does, and the
    # device plugin's, to find pods' cgroups) and the plugin's kubelet folder.
    host_paths = {"plugin": {KUBELET_DP_DIR, POD_RESOURCES_DIR, POD_LOGS_DIR, "/sys/fs/cgroup"},
                  "patcher": {"/sys/fs/cgroup"}, "dra": DRA_HOST_PATHS | {"/sys/fs/cgroup"}}[mode]
    check(all(n in sock_vols or "hostPath" not in v or v["hostPath"].get("path") in host_paths
              for n, v in vols.items()),
          f"{where}: hostPath volumes other than {SOCK_DIR} and {sorted(host_paths)}")
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    containers = {c["name"]: c for c in pod.get("containers", [])}
    side_name = {"patcher": "node-patcher", "plugin": "device-plugin", "dra": "dra-driver"}[mode]
    check(set(containers) == {"pinbrokerd", side_name, "metrics"}, f"{where}: containers {sorted(containers)}")
    daemon = containers.get("pinbrokerd", {})
    side = containers.get(side_name, {})
    metrics = containers.get("metrics", {})
    patcher = side if mode == "patcher" else {}
    for c in containers.values():
        check(c.get("image", "").rpartition("/")[2].partition(":")[2] == VERSION,
              f"{where}: container {c.get('name')} runs image {c.get('image')}, not the packages' version {VERSION} "
              "(kustomization.yaml images: newTag, from debian/changelog)")

    def mounts(c):
        return {m["mountPath"]: m for m in c.get("volumeMounts", [])}

    def mounted_cm(c, path):
        m = mounts(c).get(path)
        v = vols.get(m["name"], {}) if m else {}
        return cms.get(v.get("configMap", {}).get("name"))

    for c in (daemon, side, metrics):
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
    for c in (side, metrics):
        check(c.get("securityContext", {}).get("capabilities", {}).get("add") in (None, []),
              f"{where}: {c.get('name')} adds capabilities")
        check(mounts(c).get(SOCK_DIR, {}).get("readOnly") is True, f"{where}: {c.get('name')} mounts {SOCK_DIR} writable")
    check_metrics(where, spec.get("template", {}), metrics, mounts)
    check(TOKEN_DIR not in mounts(daemon), f"{where}: pinbrokerd gets the API token")
    # The daemon's cgroup namespace is its own (containerd, CRI-O on cgroup v2): it places it in the host's
    # tree, mounted here read-only and not over its own /sys/fs/cgroup (its memory limit is read there).
    dm = mounts(daemon).get(DAEMON_CGROUP_ROOT)
    check(dm is not None and vols.get(dm["name"], {}).get("hostPath", {}).get("path") == "/sys/fs/cgroup"
          and dm.get("readOnly") is True,
          f"{where}: pinbrokerd does not mount the host's /sys/fs/cgroup read-only at {DAEMON_CGROUP_ROOT} "
          "(pod quotas would not bind in its cgroup namespace: docs/kubernetes.md)")
    check("/sys/fs/cgroup" not in mounts(daemon), f"{where}: pinbrokerd mounts something over its own /sys/fs/cgroup")
    if mode == "plugin":
        check_plugin(where, daemon, side, vols, mounts)
    elif mode == "dra":
        check_dra(where, daemon, side, vols, mounts, pod, sas)
    else:
        check_patcher(where, patcher, vols, mounts, mounted_cm, patcher_src)
    return ds, check_daemon(where, daemon, mounted_cm, pinbrokerd)


def check_plugin(where, daemon, plugin, vols, mounts):
    def host(c, path):
        m = mounts(c).get(path)
        return vols.get(m["name"], {}).get("hostPath", {}).get("path") if m else None

    env = {e["name"]: e.get("value") for e in plugin.get("env", [])}
    check(host(plugin, KUBELET_DP_DIR) == KUBELET_DP_DIR and not mounts(plugin)[KUBELET_DP_DIR].get("readOnly"),
          f"{where}: device-plugin does not mount the kubelet's {KUBELET_DP_DIR} writable (its socket goes there)")
    cg = env.get("DP_CGROUP_ROOT", "/sys/fs/cgroup")
    check(host(plugin, cg) == "/sys/fs/cgroup" and mounts(plugin)[cg].get("readOnly") is True,
          f"{where}: device-plugin's DP_CGROUP_ROOT {cg} is not the host's /sys/fs/cgroup, read-only")
    check(env.get("PINBROKER_SOCKET") == SOCK, f"{where}: device-plugin's PINBROKER_SOCKET is not {SOCK}")
    check(env.get("DP_SOCKET_DIR_HOST", SOCK_DIR) == host(plugin, SOCK_DIR),
          f"{where}: device-plugin would mount {env.get('DP_SOCKET_DIR_HOST', SOCK_DIR)} into pods, "
          f"not the daemon's socket folder {host(plugin, SOCK_DIR)}")
    check(plugin.get("command", [])[-1:] == [PLUGIN_PATH], f"{where}: device-plugin's command is {plugin.get('command')}")
    check(TOKEN_DIR not in mounts(plugin), f"{where}: device-plugin gets an API token")
    # The pod resources API's socket and the pod log folders (a pod's UID), read-only, where the plugin looks.
    for path, var in ((POD_RESOURCES_DIR, "DP_POD_RESOURCES"), (POD_LOGS_DIR, "DP_POD_LOGS")):
        want = env.get(var, POD_RESOURCES_DIR + "/kubelet.sock" if var == "DP_POD_RESOURCES" else POD_LOGS_DIR)
        check(host(plugin, path) == path and mounts(plugin)[path].get("readOnly") is True and want.startswith(path),
              f"{where}: device-plugin does not mount the node's {path} read-only where {var} points")
    check(not any(p in mounts(daemon) for p in (KUBELET_DP_DIR, "/sys/fs/cgroup")) and
          all(m.get("readOnly") is True for p, m in mounts(daemon).items() if p == cg),
          f"{where}: pinbrokerd mounts the device plugin's host folders (the host's cgroup tree only read-only)")


def check_metrics(where, template, metrics, mounts):
    """The metrics container serves pinbroker-metrics-http on the port the scrape annotations name, with
    nothing of the node's but the socket folder."""
    ann = template.get("metadata", {}).get("annotations", {})
    ports = [p for p in metrics.get("ports", []) if p.get("name") == "metrics"]
    check(len(ports) == 1 and ports[0].get("containerPort") == METRICS_PORT and ports[0].get("protocol", "TCP") == "TCP"
          and not ports[0].get("hostPort"), f"{where}: the metrics container has no TCP port 'metrics' {METRICS_PORT}")
    check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(METRICS_PORT)
          and ann.get("prometheus.io/path") == "/metrics",
          f"{where}: the pod's prometheus.io annotations {ann} do not name port {METRICS_PORT} and /metrics")
    cmd = metrics.get("command", [])
    check(cmd[1:2] == [LISTEN_EXEC] and "--port" in cmd and cmd[cmd.index("--port") + 1:][:1] == [str(METRICS_PORT)]
          and METRICS_HTTP in cmd and SOCK in cmd,
          f"{where}: the metrics container does not run {LISTEN_EXEC} --port {METRICS_PORT} -- {METRICS_HTTP} "
          f"--socket {SOCK}: {cmd}")
    check(set(mounts(metrics)) == {SOCK_DIR}, f"{where}: the metrics container mounts {sorted(mounts(metrics))}")
    check(TOKEN_DIR not in mounts(metrics), f"{where}: the metrics container gets an API token")


def check_dra(where, daemon, drv, vols, mounts, pod, sas):
    def host(c, path):
        m = mounts(c).get(path)
        return vols.get(m["name"], {}).get("hostPath", {}).get("path") if m else None

    env = {e["name"]: e for e in drv.get("env", [])}
    check(drv.get("command", [])[-1:] == [DRA_PATH], f"{where}: dra-driver's command is {drv.get('command')}")
    for p in sorted(DRA_HOST_PATHS):
        check(host(drv, p) == p and not mounts(drv)[p].get("readOnly"),
              f"{where}: dra-driver does not mount the node's {p} writable at the same path")
    cg = env.get("DRA_CGROUP_ROOT", {}).get("value", "/sys/fs/cgroup")
    check(host(drv, cg) == "/sys/fs/cgroup" and mounts(drv)[cg].get("readOnly") is True,
          f"{where}: dra-driver's DRA_CGROUP_ROOT {cg} is not the host's /sys/fs/cgroup, read-only")
    check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
          f"{where}: dra-driver's NODE_NAME is not the downward API's spec.nodeName")
    check(env.get("PINBROKER_SOCKET", {}).get("value") == SOCK, f"{where}: dra-driver's PINBROKER_SOCKET is not {SOCK}")
    check(env.get("DRA_SOCKET_DIR_HOST", {}).get("value", SOCK_DIR) == host(drv, SOCK_DIR),
          f"{where}: dra-driver's CDI spec would mount another folder than the daemon's socket folder")
    check(env.get("DRA_DEVICES", {}).get("value", "shared") in ("shared", "gib"), f"{where}: dra-driver's DRA_DEVICES")
    tm = mounts(drv).get(TOKEN_DIR)
    srcs = vols.get(tm["name"], {}).get("projected", {}).get("sources", []) if tm else []
    check(any(x.get("serviceAccountToken", {}).get("path") == "token" for x in srcs) and
          any(i.get("path") == "ca.crt" for x in srcs for i in x.get("configMap", {}).get("items", [])),
          f"{where}: dra-driver has no projected token and ca.crt at {TOKEN_DIR}")
    check(pod.get("serviceAccountName") in sas, f"{where}: the pod does not run as the driver's ServiceAccount")
    check(TOKEN_DIR not in mounts(daemon), f"{where}: pinbrokerd gets the API token")
    check(not any(p in mounts(daemon) for p in DRA_HOST_PATHS), f"{where}: pinbrokerd mounts the driver's host folders")
    check(KUBELET_DP_DIR not in mounts(drv) and not any(v.get("hostPath", {}).get("path") == KUBELET_DP_DIR
                                                        for v in vols.values()),
          f"{where}: the device plugin's folder is still mounted")


def check_patcher(where, patcher, vols, mounts, mounted_cm, patcher_src):
    check(patcher.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: node-patcher may run as root")
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
          f"{where}: the ConfigMap at /opt/pinbroker does not hold deploy/overlays/node-patcher/node-patcher.sh")
    check(patcher.get("command") == ["/bin/sh", "/opt/pinbroker/node-patcher.sh"], f"{where}: node-patcher's command")


def check_daemon(where, daemon, mounted_cm, pinbrokerd):
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
    return conf


def check_client_hostpath(docs, where):
    """examples/client-pod-hostpath.yaml, for deploy/overlays/node-patcher: the socket by hostPath."""
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
        # Read-only, so no pod can unlink the daemon's socket or put its own in its place.
        check(m and m[0].get("readOnly") is True, f"{where}: container {name} mounts {SOCK_DIR} writable")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check(env.get("PINBROKER_SOCKET") == SOCK, f"{where}: container {name}'s PINBROKER_SOCKET is not {SOCK}")
        check(not c.get("securityContext", {}).get("capabilities", {}).get("add"), f"{where}: the client adds capabilities")


# The restricted Pod Security level (kubernetes.io/docs/concepts/security/pod-security-standards),
# the rules a pod spec shows: what admission would refuse, as far as a static check can tell.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def restricted_violations(spec):
    bad = []
    psc = spec.get("securityContext", {})
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(f):
            bad.append(f"{f} is set")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v.get('name')} is {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("windowsOptions", {}).get("hostProcess"):
        bad.append("hostProcess")
    for sysctl in psc.get("sysctls", []):
        bad.append(f"sysctl {sysctl.get('name')} (only the safe set is allowed; none is needed)")
    for c in spec.get("initContainers", []) + spec.get("containers", []) + spec.get("ephemeralContainers", []):
        sc = c.get("securityContext", {})
        name = c.get("name")

        def eff(key):
            return sc.get(key, psc.get(key))

        if sc.get("privileged"):
            bad.append(f"container {name} is privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"container {name}: allowPrivilegeEscalation is not false")
        if eff("runAsNonRoot") is not True:
            bad.append(f"container {name}: runAsNonRoot is not true")
        if eff("runAsUser") == 0:
            bad.append(f"container {name}: runAsUser 0")
        if (eff("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            bad.append(f"container {name}: seccompProfile is not RuntimeDefault or Localhost")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"container {name} does not drop ALL capabilities")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"container {name} adds {sorted(set(caps.get('add', [])) - {'NET_BIND_SERVICE'})}")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"container {name}: procMount {sc.get('procMount')}")
        if (eff("appArmorProfile") or {}).get("type") == "Unconfined":
            bad.append(f"container {name}: AppArmor unconfined")
        se = eff("seLinuxOptions") or {}
        if se.get("user") or se.get("role") or se.get("type", "") not in ("", "container_t", "container_init_t",
                                                                            "container_kvm_t", "container_engine_t"):
            bad.append(f"container {name}: seLinuxOptions {se}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"container {name} uses a hostPort")
    return bad


def check_client(docs, where):
    """examples/client-pod.yaml, for the device plugin: the pod asks for the resource and nothing
    else; the plugin gives it the socket, so it passes the restricted level."""
    pod = one(docs, "Pod", where)
    spec = pod.get("spec", {})
    for v in restricted_violations(spec):
        check(False, f"{where}: not restricted: {v}")
    check(not any("hostPath" in v for v in spec.get("volumes", [])), f"{where}: a hostPath volume (the plugin mounts the socket)")
    asks = 0
    for c in spec.get("containers", []):
        name = c.get("name")
        lim = c.get("resources", {}).get("limits", {})
        if RESOURCE in lim:
            asks += 1
            check(str(lim[RESOURCE]).isdigit(), f"{where}: container {name}: {RESOURCE} must be a whole number")
            req = c.get("resources", {}).get("requests", {}).get(RESOURCE)
            check(req is None or str(req) == str(lim[RESOURCE]), f"{where}: container {name}: {RESOURCE} request != limit")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check(env.get("PINBROKER_SOCKET", SOCK) == SOCK, f"{where}: container {name}'s PINBROKER_SOCKET is not {SOCK}")
        check(not any(m["mountPath"] == SOCK_DIR for m in c.get("volumeMounts", [])),
              f"{where}: container {name} mounts {SOCK_DIR} itself (the device plugin's mount would clash)")
    check(asks > 0, f"{where}: no container requests {RESOURCE}")
    check(61000 in spec.get("securityContext", {}).get("supplementalGroups", []),
          f"{where}: no supplementalGroups 61000 (the socket is root:pinbroker 0660)")


def check_client_dra(docs, where):
    """examples/client-pod-dra.yaml: a ResourceClaimTemplate of the driver's DeviceClass asking for an amount of
    its capacity "memory" (or a count of devices), and a pod that claims it and passes the restricted level."""
    tmpl = one(docs, "ResourceClaimTemplate", where)
    pod = one(docs, "Pod", where)
    spec = pod.get("spec", {})
    check(tmpl.get("apiVersion") == "resource.k8s.io/v1", f"{where}: the ResourceClaimTemplate is not resource.k8s.io/v1")
    reqs = tmpl.get("spec", {}).get("spec", {}).get("devices", {}).get("requests", [])
    check(len(reqs) == 1 and reqs[0].get("exactly", {}).get("deviceClassName") == DRA_DRIVER,
          f"{where}: the template does not ask for one request of DeviceClass {DRA_DRIVER}")
    ex = reqs[0].get("exactly", {}) if reqs else {}
    amount = ex.get("capacity", {}).get("requests", {}).get("memory")
    check((amount is not None and qty_bytes(amount)) or (amount is None and ex.get("count")),
          f"{where}: the request asks for no amount of capacity memory (nor a count of gib devices)")
    check(tmpl.get("metadata", {}).get("namespace") == pod.get("metadata", {}).get("namespace"),
          f"{where}: the template and the pod are in different namespaces")
    claims = {c.get("name"): c for c in spec.get("resourceClaims", [])}
    check(any(c.get("resourceClaimTemplateName") == tmpl.get("metadata", {}).get("name") for c in claims.values()),
          f"{where}: the pod claims nothing from the template")
    used = {r.get("name") for c in spec.get("containers", []) for r in c.get("resources", {}).get("claims", [])}
    check(used and used <= set(claims), f"{where}: containers use claims {sorted(used)}, the pod has {sorted(claims)}")
    for v in restricted_violations(spec):
        check(False, f"{where}: not restricted: {v}")
    check(not any("hostPath" in v for v in spec.get("volumes", [])), f"{where}: a hostPath volume (CDI mounts the socket)")
    check(61000 in spec.get("securityContext", {}).get("supplementalGroups", []),
          f"{where}: no supplementalGroups 61000 (the socket is root:pinbroker 0660)")


def check_podmonitor(docs, where):
    pm = one(docs, "PodMonitor", where)
    sel = pm.get("spec", {}).get("selector", {}).get("matchLabels", {})
    eps = pm.get("spec", {}).get("podMetricsEndpoints", [])
    check(pm.get("apiVersion") == "monitoring.coreos.com/v1" and pm.get("metadata", {}).get("namespace") == "pinbroker"
          and sel == {"app.kubernetes.io/name": "pinbrokerd"} and
          [(e.get("port"), e.get("path", "/metrics")) for e in eps] == [("metrics", "/metrics")],
          f"{where}: the PodMonitor does not select the pinbrokerd pods' port 'metrics' at /metrics")


def pod_of(docs):
    return [d for d in docs if d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]


def daemon_of(docs):
    return [c for c in pod_of(docs)["containers"] if c["name"] == "pinbrokerd"][0]


def side_of(docs, name):
    return [c for c in pod_of(docs)["containers"] if c["name"] == name][0]


def client_of(docs):
    return [d for d in docs if d["kind"] == "Pod"][0]["spec"]


# Each breaks one thing the checks are for; every one must be caught, so the checks can fail.
# (rendering the mutation applies to: base, patcher (deploy/overlays/node-patcher) or client)
MUTATIONS = {
    "no IPC_LOCK": ("base", lambda d: daemon_of(d)["securityContext"]["capabilities"]["add"].remove("IPC_LOCK")),
    "privileged": ("base", lambda d: daemon_of(d)["securityContext"].update(privileged=True)),
    "SYS_ADMIN": ("base", lambda d: daemon_of(d)["securityContext"]["capabilities"]["add"].append("SYS_ADMIN")),
    "no hostPID": ("base", lambda d: pod_of(d).pop("hostPID")),
    "socket elsewhere": ("base", lambda d: [v["hostPath"].update(path="/var/run/pb") for v in pod_of(d)["volumes"]
                                            if v.get("hostPath", {}).get("path") == SOCK_DIR]),
    "RBAC list": ("patcher", lambda d: [r["verbs"].append("list") for x in d if x["kind"] == "ClusterRole" for r in x["rules"]]),
    "RBAC nodes patch": ("patcher", lambda d: [x["rules"].append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]})
                                               for x in d if x["kind"] == "ClusterRole"]),
    "token in every container": ("patcher", lambda d: pod_of(d).pop("automountServiceAccountToken")),
    "patcher token in the base": ("base", lambda d: pod_of(d).pop("automountServiceAccountToken")),
    "budget over the limit": ("base", lambda d: [x["data"].update({"pinbrokerd.conf": x["data"]["pinbrokerd.conf"].replace("budget = 75%", "budget = 95%")})
                                                 for x in d if x["kind"] == "ConfigMap" and "pinbrokerd.conf" in x["data"]]),
    "bad config key": ("base", lambda d: [x["data"].update({"pinbrokerd.conf": x["data"]["pinbrokerd.conf"] + "no-such-key = 1\n"})
                                          for x in d if x["kind"] == "ConfigMap" and "pinbrokerd.conf" in x["data"]]),
    "burstable": ("base", lambda d: daemon_of(d)["resources"]["requests"].update(memory="1Gi")),
    "no device plugin": ("base", lambda d: pod_of(d)["containers"].remove(side_of(d, "device-plugin"))),
    "plugin without the kubelet's folder": ("base", lambda d: side_of(d, "device-plugin")["volumeMounts"].pop(1)),
    "plugin privileged": ("base", lambda d: side_of(d, "device-plugin")["securityContext"].update(privileged=True)),
    "host cgroups writable": ("base", lambda d: [m.update(readOnly=False) for m in side_of(d, "device-plugin")["volumeMounts"]
                                                 if m["mountPath"] == DAEMON_CGROUP_ROOT]),
    "daemon's host cgroups writable": ("base", lambda d: [m.update(readOnly=False) for m in daemon_of(d)["volumeMounts"]
                                                          if m["mountPath"] == DAEMON_CGROUP_ROOT]),
    "daemon without the host cgroups": ("base", lambda d: daemon_of(d).update(volumeMounts=[
        m for m in daemon_of(d)["volumeMounts"] if m["mountPath"] != DAEMON_CGROUP_ROOT])),
    "patcher daemon without the host cgroups": ("patcher", lambda d: daemon_of(d).update(volumeMounts=[
        m for m in daemon_of(d)["volumeMounts"] if m["mountPath"] != DAEMON_CGROUP_ROOT])),
    "daemon cgroups over its own": ("base", lambda d: [m.update(mountPath="/sys/fs/cgroup") for m in daemon_of(d)["volumeMounts"]
                                                       if m["mountPath"] == DAEMON_CGROUP_ROOT]),
    "plugin mounts another folder": ("base", lambda d: [e.update(value="/tmp") for e in side_of(d, "device-plugin")["env"]
                                                         if e["name"] == "DP_SOCKET_DIR_HOST"]),
    "host /etc mounted": ("base", lambda d: pod_of(d)["volumes"].append({"name": "etc", "hostPath": {"path": "/etc"}})),
    "client hostPath": ("client", lambda d: client_of(d).setdefault("volumes", []).append(
        {"name": "pb", "hostPath": {"path": SOCK_DIR}})),
    "client privileged": ("client", lambda d: client_of(d)["containers"][0]["securityContext"].update(privileged=True)),
    "client may run as root": ("client", lambda d: client_of(d)["securityContext"].pop("runAsNonRoot")),
    "client runs as uid 0": ("client", lambda d: client_of(d)["securityContext"].update(runAsUser=0)),
    "client unconfined seccomp": ("client", lambda d: client_of(d)["securityContext"].update(seccompProfile={"type": "Unconfined"})),
    "client keeps capabilities": ("client", lambda d: client_of(d)["containers"][0]["securityContext"].pop("capabilities")),
    "client adds NET_RAW": ("client", lambda d: client_of(d)["containers"][0]["securityContext"]["capabilities"].update(add=["NET_RAW"])),
    "client escalates": ("client", lambda d: client_of(d)["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")),
    "client hostNetwork": ("client", lambda d: client_of(d).update(hostNetwork=True)),
    "client asks nothing": ("client", lambda d: client_of(d)["containers"][0]["resources"]["limits"].pop(RESOURCE)),
    "hostPath client's socket folder writable": ("hostpath", lambda d: [m.pop("readOnly", None)
                                                 for m in client_of(d)["containers"][0]["volumeMounts"]]),
    "plugin's pod-resources writable": ("base", lambda d: [m.update(readOnly=False) for m in side_of(d, "device-plugin")["volumeMounts"]
                                                            if m["mountPath"] == POD_RESOURCES_DIR]),
    "plugin without the pod log folders": ("base", lambda d: side_of(d, "device-plugin").update(volumeMounts=[
        m for m in side_of(d, "device-plugin")["volumeMounts"] if m["mountPath"] != POD_LOGS_DIR])),
    "no metrics port": ("base", lambda d: side_of(d, "metrics").pop("ports")),
    "scrape annotation on another port": ("base", lambda d: [x for x in d if x["kind"] == "DaemonSet"][0]["spec"]["template"]
                                          ["metadata"]["annotations"].update({"prometheus.io/port": "9100"})),
    "metrics container with a capability": ("base", lambda d: side_of(d, "metrics")["securityContext"]["capabilities"]
                                            .update(add=["SYS_PTRACE"])),
    "image tag of another version": ("base", lambda d: [c.update(image="pinbroker:0.1.0") for c in pod_of(d)["containers"]]),
    "DRA RBAC list claims": ("dra", lambda d: [r["verbs"].append("list") for x in d if x["kind"] == "ClusterRole"
                                               for r in x["rules"] if "resourceclaims" in r["resources"]]),
    "DRA RBAC delete nodes": ("dra", lambda d: [r["verbs"].append("delete") for x in d if x["kind"] == "ClusterRole"
                                                for r in x["rules"] if "nodes" in r["resources"]]),
    "DRA token in every container": ("dra", lambda d: pod_of(d).pop("automountServiceAccountToken")),
    "DRA registry read-only": ("dra", lambda d: [m.update(readOnly=True) for m in side_of(d, "dra-driver")["volumeMounts"]
                                                 if m["mountPath"] == "/var/lib/kubelet/plugins_registry"]),
    "DRA without the CDI folder": ("dra", lambda d: side_of(d, "dra-driver").update(volumeMounts=[
        m for m in side_of(d, "dra-driver")["volumeMounts"] if m["mountPath"] != "/var/run/cdi"])),
    "DRA device plugin left in": ("dra", lambda d: pod_of(d)["volumes"].append(
        {"name": "dp", "hostPath": {"path": KUBELET_DP_DIR}})),
    "DeviceClass of another driver": ("dra", lambda d: [x["spec"]["selectors"][0]["cel"].update(expression='device.driver == "x.example.com"')
                                                        for x in d if x["kind"] == "DeviceClass"]),
    "DRA client asks no amount": ("client-dra", lambda d: [x["spec"]["spec"]["devices"]["requests"][0]["exactly"].pop("capacity")
                                                           for x in d if x["kind"] == "ResourceClaimTemplate"]),
    "DRA client hostPath": ("client-dra", lambda d: client_of(d).setdefault("volumes", []).append(
        {"name": "pb", "hostPath": {"path": SOCK_DIR}})),
    "DRA client uses no claim": ("client-dra", lambda d: client_of(d)["containers"][0]["resources"].pop("claims")),
    "PodMonitor on another port": ("podmonitor", lambda d: d[0]["spec"]["podMetricsEndpoints"][0].update(port="http")),
}


def self_test(paths, pinbrokerd, patcher_src):
    global failures
    missed = []
    for name, (which, mutate) in MUTATIONS.items():
        docs = load(paths[which])
        mutate(docs)
        failures = []
        if which == "client":
            check_client(docs, "mutated")
        elif which == "hostpath":
            check_client_hostpath(docs, "mutated")
        elif which == "client-dra":
            check_client_dra(docs, "mutated")
        elif which == "podmonitor":
            check_podmonitor(docs, "mutated")
        else:
            check_rendered(docs, "mutated", pinbrokerd, patcher_src, {"patcher": "patcher", "dra": "dra"}.get(which, "plugin"))
        print(f"self-test: {name}: {'caught: ' + failures[0].splitlines()[0] if failures else 'NOT CAUGHT'}")
        if not failures:
            missed.append(name)
    failures = [f"self-test: the checks did not catch '{m}'" for m in missed]


def main():
    global VERSION
    base_path, overlay_path, patcher_ov_path, client_path, client_hp_path, pinbrokerd, patcher_path = sys.argv[1:8]
    dra_path, client_dra_path, podmonitor_path, VERSION = sys.argv[8:12]
    with open(patcher_path) as f:
        patcher_src = f.read()
    self_test({"base": base_path, "patcher": patcher_ov_path, "client": client_path, "hostpath": client_hp_path,
               "dra": dra_path, "client-dra": client_dra_path, "podmonitor": podmonitor_path}, pinbrokerd, patcher_src)
    base_ds, base_conf = check_rendered(load(base_path), "base", pinbrokerd, patcher_src)
    ov_ds, ov_conf = check_rendered(load(overlay_path), "overlay", pinbrokerd, patcher_src)
    check_rendered(load(patcher_ov_path), "node-patcher overlay", pinbrokerd, patcher_src, "patcher")
    check_rendered(load(dra_path), "dra overlay", pinbrokerd, patcher_src, "dra")
    check_client_dra(load(client_dra_path), "DRA client pod")
    check_podmonitor(load(podmonitor_path), "PodMonitor")
    lim = lambda ds: ds["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    check(lim(base_ds) != lim(ov_ds) and base_conf != ov_conf,
          "overlay: neither the memory limit nor the config differs from the base")
    check_client(load(client_path), "client pod")
    check_client_hostpath(load(client_hp_path), "hostPath client pod")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
