#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# deploy/kubernetes/dra (the DRA driver) against the real pinbrokerd and pinctl, a stand-in kubelet made from the
# vendored protos (the plugin watcher's calls to pluginregistration/v1 GetInfo and NotifyRegistrationStatus, then
# dra/v1 NodePrepareResources and NodeUnprepareResources on the socket GetInfo names) and a stand-in API server
# (tests/deploy/fake-apiserver.py: ResourceSlices validated as the API server does, ResourceClaims written by this
# test with their allocation and reservedFor, as the scheduler leaves them): registration; the ResourceSlice (the
# budget as one shared device's consumable capacity, owned by the Node; rewritten with a higher pool generation
# after `pinctl set budget`; DRA_DEVICES=gib's one device per GiB); the CDI spec (the socket folder read-only,
# PINBROKER_SOCKET); a claim's consumedCapacity, and a whole device's capacity, set as the quota of the pod it is
# reserved for (the sum of its claims) in a fake cgroup tree; claims that must fail (another node's pool, a
# replaced UID, not allocated, not found) failing with a reason and changing no quota; quotas set again after a
# daemon restart and after a driver restart (the prepared claims kept on disk); unprepare lowering and then
# clearing the quota; a real cgroup of this host, where it can make one, whose client is refused past its
# claim; DRA_STRICT; SIGTERM.
# usage: run-dra-driver.py SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import deploycheck as dc  # tests/deploy, beside this script
from deploycheck import fail, ok, skip

GIB = 1 << 30
MIB = 1 << 20

grpc = dc.require_grpc()

SRC, BUILD = sys.argv[1], sys.argv[2]
DRA_DIR = os.path.join(SRC, "deploy/kubernetes/dra")
DRIVER = os.path.join(DRA_DIR, "pinbroker-dra-driver.py")
NAME = "pinned-memory.pinbroker.io"
NODE = "gpu-node-1"
CDI_ID = "pinbroker.io/pinned-memory=socket"
if os.geteuid() != 0:
    skip("needs root: pinctl quota set and set budget are admin requests")
if not shutil.which("openssl"):
    skip("openssl not found (apt-get install openssl): the stand-in API server needs a certificate")
H = dc.Harness("pinbroker-dra.", BUILD, timeout_s=15.0)
T, PINCTL, procs, real_cgroups = H.tmp, H.pinctl, H.procs, H.cgroups
cleanup, wait_for = H.cleanup, H.wait_for
# The stubs, generated from the vendored protos by the code the image build runs, not committed.
STUBS = dc.compile_stubs(SRC, DRA_DIR, ["dra", "pluginregistration"], T)
import dra_pb2 as dra  # noqa: E402
import dra_pb2_grpc as dra_grpc  # noqa: E402
import pluginregistration_pb2 as reg  # noqa: E402
import pluginregistration_pb2_grpc as reg_grpc  # noqa: E402

# The daemon: its config (write_conf rewrites the budget), socket, pinctl and quota rules.
DAEMON = H.daemon
RUN, SOCK, CONF = DAEMON.run, DAEMON.sock, DAEMON.conf
write_conf, pinctl, start_daemon, rules = DAEMON.write_conf, DAEMON.pinctl, DAEMON.start, DAEMON.rules


def budget():
    return json.loads(pinctl("status", "--json").stdout)["budget_bytes"]


# The stand-in API server.
TOKEN = "dra-test-token-" + os.urandom(8).hex()
with open(os.path.join(T, "token"), "w") as f:
    f.write(TOKEN + "\n")
r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", os.path.join(T, "key.pem"),
                    "-out", os.path.join(T, "ca.crt"), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True)
if r.returncode != 0:
    fail(f"openssl could not make a certificate: {r.stderr}")
api_log = os.path.join(T, "api.log")
procs.append(subprocess.Popen([sys.executable, os.path.join(SRC, "tests/deploy/fake-apiserver.py"),
                               os.path.join(T, "ca.crt"), os.path.join(T, "key.pem"), TOKEN, NODE,
                               os.path.join(T, "port"), os.path.join(T, "requests.log")],
                              stdout=open(api_log, "w"), stderr=subprocess.STDOUT))
wait_for("the stand-in API server listening", lambda: os.path.exists(os.path.join(T, "port")))
API = "https://127.0.0.1:" + open(os.path.join(T, "port")).read().strip()
CTX = ssl.create_default_context(cafile=os.path.join(T, "ca.crt"))


def api(method, path, body=None):
    req = urllib.request.Request(API + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=CTX, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def the_slice():
    code, obj = api("GET", f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-{NAME}")
    return obj if code == 200 else None


def claim(ns, name, uid, pods, results, allocated=True):
    """A ResourceClaim as the scheduler leaves it: allocated (results: (request, pool, device, consumed or None))
    and reserved for pods ((name, uid))."""
    status = {"reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods]}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            dict({"request": rq, "driver": NAME, "pool": pool, "device": dev},
                 **({"consumedCapacity": {"memory": c}, "shareID": "1d4b2f6e-8c1a-4f5e-9a3b-7c2d1e0f9a8b"} if c else {}))
            for rq, pool, dev, c in results]}}
    code, _ = api("POST", "/_test/claim", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                           "metadata": {"namespace": ns, "name": name, "uid": uid},
                                           "spec": {"devices": {"requests": []}}, "status": status})
    if code != 200:
        fail(f"the stand-in API server did not take claim {ns}/{name}")
    return dra.Claim(namespace=ns, name=name, uid=uid)


CG = os.path.join(T, "cgroup")
POD_A = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"  # systemd driver, burstable
POD_B = "6fa459ea-ee8a-3ca4-894e-db77e160355e"  # cgroupfs driver, besteffort
CG_A = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + POD_A.replace("-", "_") + ".slice"
CG_B = "/kubepods/besteffort/pod" + POD_B
os.makedirs(CG + CG_A)
os.makedirs(CG + CG_B)
PLUGINS = os.path.join(T, "plugins", NAME)
REGISTRY = os.path.join(T, "plugins_registry")
CDI = os.path.join(T, "cdi")
os.makedirs(REGISTRY)
ENV = dict(os.environ, NODE_NAME=NODE, PINBROKER_SOCKET=SOCK, PINCTL=PINCTL, DRA_PLUGIN_DIR=PLUGINS,
           DRA_REGISTRY_DIR=REGISTRY, DRA_CDI_DIR=CDI, DRA_SOCKET_DIR_HOST=RUN, DRA_CGROUP_ROOT=CG, DRA_POLL_S="0.3",
           DRA_API_URL=API, DRA_TOKEN_FILE=os.path.join(T, "token"), DRA_CA_FILE=os.path.join(T, "ca.crt"),
           DRA_STUBS_DIR=STUBS)


def start_driver():
    log = open(os.path.join(T, "driver.log"), "a")
    p = subprocess.Popen([sys.executable, DRIVER], env=ENV, stdout=log, stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def driver_log():
    with open(os.path.join(T, "driver.log")) as f:
        return f.read()


def register():
    """The kubelet's plugin watcher: GetInfo on the registration socket, then NotifyRegistrationStatus."""
    sock = os.path.join(REGISTRY, NAME + "-reg.sock")
    wait_for(f"the registration socket {sock}", lambda: os.path.exists(sock))
    with grpc.insecure_channel("unix://" + sock) as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg.InfoRequest(), timeout=10)
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=10)
    return info


def module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dradrv", DRIVER)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def main():
    write_conf("3G")
    daemon = start_daemon()
    driver = start_driver()

    # 1. Registration, as the kubelet's plugin watcher does it.
    info = register()
    if (info.type, info.name, list(info.supported_versions)) != ("DRAPlugin", NAME, ["v1.DRAPlugin"]) or \
            info.endpoint != os.path.join(PLUGINS, "dra.sock") or not os.path.exists(info.endpoint):
        fail(f"GetInfo: {info}")
    wait_for("the driver logging the registration", lambda: "registered with the kubelet" in driver_log())
    ok(f"registration: GetInfo says DRAPlugin {NAME}, v1.DRAPlugin at {info.endpoint}")
    stub = dra_grpc.DRAPluginStub(grpc.insecure_channel("unix://" + info.endpoint))

    # 2. The ResourceSlice: the budget as the consumable capacity of one shared device, owned by the Node.
    b = budget()
    s = wait_for("the ResourceSlice published", the_slice)
    spec = s["spec"]
    devs = spec.get("devices", [])
    cap = devs[0]["capacity"]["memory"] if len(devs) == 1 else {}
    if spec.get("driver") != NAME or spec.get("nodeName") != NODE or spec.get("pool", {}).get("name") != NODE \
            or devs[0].get("allowMultipleAllocations") is not True or int(cap.get("value", -1)) != b // (2 * MIB) * 2 * MIB \
            or cap.get("requestPolicy", {}).get("validRange", {}).get("step") != str(2 * MIB):
        fail(f"the ResourceSlice for budget {b}: {json.dumps(s)}")
    owner = s["metadata"].get("ownerReferences", [{}])[0]
    if (owner.get("kind"), owner.get("name"), owner.get("uid")) != ("Node", NODE, "5e0c7a4e-6a55-4b8e-9f0d-000000000001"):
        fail(f"the ResourceSlice is not owned by the Node: {s['metadata']}")
    schema_check(s)
    gen = spec["pool"]["generation"]
    ok(f"ResourceSlice {s['metadata']['name']}: device 'pinned', capacity memory {cap['value']} (budget {b}), "
       "shared, owned by the Node")
    pinctl("set", "budget", "4G")
    s = wait_for("the ResourceSlice after pinctl set budget 4G",
                 lambda: (x := the_slice()) and int(x["spec"]["devices"][0]["capacity"]["memory"]["value"]) == 4 * GIB and x)
    if s["spec"]["pool"]["generation"] <= gen:
        fail(f"the pool's generation did not increase: {gen} -> {s['spec']['pool']['generation']}")
    ok(f"after pinctl set budget 4G: capacity {4 * GIB}, pool generation {gen} -> {s['spec']['pool']['generation']}")
    # The stand-in validates: a policy on a device not shared is refused, as by the API server.
    bad = json.loads(json.dumps(s))
    del bad["spec"]["devices"][0]["allowMultipleAllocations"]
    code, obj = api("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-{NAME}", bad)
    if code != 422:
        fail(f"the stand-in API server took an invalid slice: {code} {obj}")

    # 3. The CDI spec: the socket folder read-only and PINBROKER_SOCKET.
    with open(os.path.join(CDI, "pinbroker.io-pinned-memory.json")) as f:
        cdi = json.load(f)
    edits = cdi["devices"][0]["containerEdits"] if cdi.get("devices") else {}
    if cdi.get("kind") != "pinbroker.io/pinned-memory" or cdi["devices"][0].get("name") != "socket" \
            or edits.get("env") != ["PINBROKER_SOCKET=/run/pinbroker/pinbroker.sock"] \
            or [(m["hostPath"], m["containerPath"], "ro" in m.get("options", [])) for m in edits.get("mounts", [])] \
            != [(RUN, "/run/pinbroker", True)]:
        fail(f"the CDI spec: {cdi}")
    ok(f"CDI spec: {CDI_ID} mounts {RUN} read-only at /run/pinbroker, sets PINBROKER_SOCKET")

    # 4. NodePrepareResources: a claim's consumedCapacity (2Gi) becomes the quota of the pod it is reserved for.
    c1 = claim("team-a", "train-0-pinned-x7k2p", "c1000000-0000-4000-8000-000000000001", [("train-0", POD_A)],
               [("pinned", NODE, "pinned", "2Gi")])
    resp = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[c1]), timeout=30)
    r1 = resp.claims[c1.uid]
    if r1.error or [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in r1.devices] \
            != [(["pinned"], NODE, "pinned", [CDI_ID])]:
        fail(f"NodePrepareResources: {resp}")
    if rules().get(CG_A) != 2 * GIB:
        fail(f"after NodePrepareResources the quota of {CG_A} is {rules().get(CG_A)}, expected {2 * GIB}: {rules()}")
    ok(f"NodePrepareResources: claim of 2Gi -> quota 2 GiB for {CG_A}, device with {CDI_ID}")

    # A second claim of the same pod adds up (1536Mi); a claim on whole devices of DRA_DEVICES=gib
    # (no consumedCapacity: 1 GiB each) for pod B; claims that must fail, in the same call.
    c2 = claim("team-a", "train-0-scratch-9f3kd", "c1000000-0000-4000-8000-000000000002", [("train-0", POD_A)],
               [("scratch", NODE, "pinned", "1536Mi")])
    c3 = claim("team-b", "job-0-pinned-m2x8q", "c1000000-0000-4000-8000-000000000003", [("job-0", POD_B)],
               [("pinned", NODE, "gib-0", None), ("pinned", NODE, "gib-1", None)])
    other = claim("team-c", "elsewhere", "c1000000-0000-4000-8000-000000000004", [("x", POD_B)],
                  [("pinned", "gpu-node-2", "pinned", "1Gi")])
    replaced = claim("team-c", "replaced", "c1000000-0000-4000-8000-000000000005", [("x", POD_B)],
                     [("pinned", NODE, "pinned", "1Gi")])
    replaced.uid = "c1000000-0000-4000-8000-0000000000ff"
    unalloc = claim("team-c", "pending", "c1000000-0000-4000-8000-000000000006", [("x", POD_B)], [], allocated=False)
    missing = dra.Claim(namespace="team-c", name="no-such-claim", uid="c1000000-0000-4000-8000-000000000007")
    resp = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[c2, c3, other, replaced, unalloc, missing]),
                                     timeout=30)
    want_err = {other.uid: "no device of", replaced.uid: "was replaced", unalloc.uid: "is not allocated",
                missing.uid: "not found"}
    for uid, frag in want_err.items():
        if frag not in resp.claims[uid].error:
            fail(f"claim {uid}: error {resp.claims[uid].error!r}, expected one saying {frag!r}")
    if resp.claims[c2.uid].error or resp.claims[c3.uid].error:
        fail(f"NodePrepareResources: {resp}")
    if rules().get(CG_A) != 2 * GIB + 1536 * MIB or rules().get(CG_B) != 2 * GIB:
        fail(f"quotas after the second prepare: {rules()}, expected {CG_A} 3.5 GiB and {CG_B} 2 GiB")
    ok("a second claim adds up (3.5 GiB for pod A); two whole gib devices give pod B 2 GiB; "
       "another node's pool, a replaced UID, an unallocated and a missing claim fail with their reason")

    # 5. A daemon restart forgets the rules: the poll sets them again.
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout=20)
    write_conf("4G")
    daemon = start_daemon()
    wait_for("quotas set again after the daemon restarted",
             lambda: rules().get(CG_A) == 2 * GIB + 1536 * MIB and rules().get(CG_B) == 2 * GIB)
    ok("daemon restarted: both pods' quotas set again")

    # 6. A driver restart keeps the prepared claims (claims.json); the kubelet preparing a known claim again
    # needs no API server (the claim is gone from it now).
    driver.send_signal(signal.SIGTERM)
    if driver.wait(timeout=15) != 0 or os.path.exists(info.endpoint):
        fail(f"SIGTERM: exit {driver.returncode}, socket left: {os.path.exists(info.endpoint)}")
    ok("SIGTERM: exit 0, sockets removed")
    pinctl("quota", "clear", CG_B)
    api("DELETE", f"/_test/claim/team-a/{c1.name}")
    driver = start_driver()
    register()
    wait_for("pod B's quota set again by the restarted driver", lambda: rules().get(CG_B) == 2 * GIB)
    resp = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[c1]), timeout=30)
    if resp.claims[c1.uid].error or len(resp.claims[c1.uid].devices) != 1:
        fail(f"preparing a known claim again after a driver restart: {resp}")
    ok("driver restarted: prepared claims read back, quotas repaired, a known claim prepared again")

    # 7. NodeUnprepareResources: the quota drops to the claims left, then the rule goes.
    resp = stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[c2]), timeout=30)
    if resp.claims[c2.uid].error or rules().get(CG_A) != 2 * GIB:
        fail(f"after unpreparing the 1536Mi claim: {resp} {rules()}")
    resp = stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[c1, c3, missing]), timeout=30)
    if any(resp.claims[u].error for u in (c1.uid, c3.uid, missing.uid)) or CG_A in rules() or CG_B in rules():
        fail(f"after unpreparing every claim: {resp} {rules()}")
    ok("NodeUnprepareResources: pod A back to 2 GiB, then both rules cleared; an unknown claim is no error")

    real_check()
    strict_and_gib_check()
    metrics_check()

    driver.send_signal(signal.SIGTERM)
    if driver.wait(timeout=15) != 0:
        fail(f"SIGTERM: exit {driver.returncode}")
    print("PASS: DRA driver")


def schema_check(obj):
    """The published ResourceSlice against Kubernetes' own schema (kubernetes-models), where node has it."""
    models = os.environ.get("PINBROKER_K8S_MODELS") or os.path.join(SRC, ".cache/k8s-schema/node_modules")
    if not shutil.which("node") or not os.path.isdir(os.path.join(models, "kubernetes-models")):
        print("note: the ResourceSlice's schema check did not run (needs node and kubernetes-models: scripts/deps.sh --test)")
        return
    r = subprocess.run(["node", os.path.join(SRC, "tests/deploy/validate-schema.js")], input=json.dumps([obj]),
                       capture_output=True, text=True, env=dict(os.environ, NODE_PATH=models))
    if r.returncode != 0:
        fail(f"the published ResourceSlice fails the schema: {r.stdout}{r.stderr}")
    ok(f"the ResourceSlice passes the resource.k8s.io/v1 schema: {r.stdout.strip()}")


def metrics_check():
    """The DaemonSet's metrics container as it runs there: its command from daemonset.yaml (paths mapped to this
    build), a scrape of /metrics on its port answered 200 with the daemon's budget."""
    import socket

    import yaml

    with open(os.path.join(SRC, "deploy/kubernetes/daemonset.yaml")) as f:
        ds = yaml.safe_load(f)
    tmpl = ds["spec"]["template"]
    c = [c for c in tmpl["spec"]["containers"] if c["name"] == "metrics"][0]
    port = int(tmpl["metadata"]["annotations"]["prometheus.io/port"])
    with socket.socket() as s0:  # a free port stands in for the pod's own 9464
        s0.bind(("127.0.0.1", 0))
        free = s0.getsockname()[1]
    cmd = c["command"][:]
    cmd[cmd.index("--port") + 1] = str(free)
    cmd = [{"/usr/lib/pinbroker/kubernetes/listen-exec.py": os.path.join(SRC, "deploy/kubernetes/listen-exec.py"),
            "/usr/libexec/pinbroker-metrics-http": os.path.join(BUILD, "client/pinbroker-metrics-http"),
            "/run/pinbroker/pinbroker.sock": SOCK, "/usr/bin/python3": sys.executable}.get(a, a) for a in cmd]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(T, "metrics.log"), "w"))
    procs.append(p)

    def scrape():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{free}{tmpl['metadata']['annotations']['prometheus.io/path']}",
                                        timeout=5) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except (OSError, urllib.error.URLError):
            return None

    code, ctype, text = wait_for("the metrics container answering", scrape)
    want = f"pinbroker_budget_bytes {budget()}"
    if code != 200 or not ctype.startswith("text/plain") or want not in text.splitlines():
        fail(f"scraping the metrics container: {code} {ctype}, no line {want!r}")
    p.terminate()
    p.wait(timeout=10)
    ok(f"metrics container (annotated port {port}): listen-exec.py + pinbroker-metrics-http answer /metrics 200 "
       f"with {want}")


def strict_and_gib_check():
    """DRA_STRICT=1: a claim whose pod has no cgroup here fails to prepare (without it, it succeeds);
    DRA_DEVICES=gib: one device of 1Gi per whole GiB of budget, accepted by the stand-in's validation."""
    m = module()
    pod = "0d9f1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
    c = claim("team-s", "strict", "c2000000-0000-4000-8000-000000000001", [("s-0", pod)], [("pinned", NODE, "pinned", "1Gi")])
    for strict in ("0", "1"):
        env = dict(ENV, DRA_STRICT=strict, DRA_PLUGIN_DIR=os.path.join(T, "strict" + strict))
        os.makedirs(env["DRA_PLUGIN_DIR"])
        d = m.Driver(m.Config(env), dra, dra_grpc)
        d.poll_budget()
        err = d.prepare(c).error
        if (strict == "1") != ("could not be set (DRA_STRICT=1)" in err) or (strict == "0" and err):
            fail(f"DRA_STRICT={strict}: a claim whose pod has no cgroup: error {err!r}")
    ok("DRA_STRICT=1: a claim whose pod's quota cannot be set fails to prepare; by default it is prepared")
    d = m.Driver(m.Config(dict(ENV, DRA_DEVICES="gib")), dra, dra_grpc)
    d.poll_budget()
    d.publish()
    devs = the_slice()["spec"]["devices"]
    if [x["name"] for x in devs] != ["gib-0", "gib-1", "gib-2", "gib-3"] or \
            any(x["capacity"]["memory"]["value"] != "1Gi" or "allowMultipleAllocations" in x for x in devs):
        fail(f"DRA_DEVICES=gib with a 4G budget: {devs}")
    ok("DRA_DEVICES=gib: 4 devices of 1Gi for a 4G budget, accepted")


def real_check():
    """A real pod-named cgroup on this host: the quota from a prepared claim binds a client moved into it."""
    uid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    made = dc.make_pod_cgroup("kubepods-pinbroker-dra-test", uid, real_cgroups)
    if not made:
        return
    base, rel = made
    m = module()
    env = dict(ENV, DRA_CGROUP_ROOT="/sys/fs/cgroup", DRA_PLUGIN_DIR=os.path.join(T, "real"))
    os.makedirs(env["DRA_PLUGIN_DIR"])
    d = m.Driver(m.Config(env), dra, dra_grpc)
    d.poll_budget()
    c = claim("team-r", "real-0", "c3000000-0000-4000-8000-000000000001", [("real-0", uid)], [("pinned", NODE, "pinned", "2Gi")])
    if d.prepare(c).error or rules().get(rel) != 2 * GIB:
        fail(f"the real pod cgroup {rel} got no 2 GiB quota: {rules()}")
    for size, refused in (("3G", True), ("1G", False)):
        dc.acquire_in_cgroup(PINCTL, SOCK, base + rel, rel, size, refused, "claim 2Gi")
    ok("real cgroup: the claim's 2 GiB bind: a 3G acquire there refused, 1G granted")
    d.unprepare(c)
    if rel in rules():
        fail(f"the real pod's rule stayed after unprepare: {rules()}")


try:
    main()
finally:
    cleanup()
