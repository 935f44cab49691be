#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# deploy/kubernetes/device-plugin against the real pinbrokerd and pinctl and a stand-in kubelet: a gRPC
# Registration server on a unix socket, a PodResourcesLister (the pod resources API v1, from the vendored
# podresources.proto) on another, the kubelet's pod log folders made by hand, and for the fallback of
# kubelets without that API, the device checkpoint written by hand: registration; ListAndWatch (one device per
# GiB of budget, updated after a config reload and after `pinctl set budget`, unhealthy while the daemon is
# down, healthy again after); Allocate (the socket folder mounted read-only, PINBROKER_SOCKET); the pod's
# request, as List reports it, set as its job quota by PreStartContainer (systemd driver's cgroup names) and by
# the poll (cgroupfs driver's, and a pod name with an earlier pod's log folder beside it), in a fake cgroup
# tree, and set again after a daemon restart; a List that fails changing nothing; a real cgroup of this host,
# where it can make one, whose client is refused past the quota; the checkpoint used only where the socket is
# missing or serves no v1; re-registration when the kubelet empties its folder; SIGTERM.
# usage: run-device-plugin.py SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import deploycheck as dc  # tests/deploy, beside this script
from deploycheck import fail, ok, skip

GIB = 1 << 30

grpc = dc.require_grpc()

SRC, BUILD = sys.argv[1], sys.argv[2]
DP_DIR = os.path.join(SRC, "deploy/kubernetes/device-plugin")
PLUGIN = os.path.join(DP_DIR, "pinbroker-device-plugin.py")
RESOURCE = "pinbroker.io/pinned-gib"
if os.geteuid() != 0:
    skip("needs root: pinctl quota set and set budget are admin requests")
H = dc.Harness("pinbroker-dp.", BUILD, timeout_s=10.0)
T, PINCTL, procs, real_cgroups = H.tmp, H.pinctl, H.procs, H.cgroups
cleanup, wait_for = H.cleanup, H.wait_for
# The stubs, generated from the vendored protos by the code the image build runs, not committed.
STUBS = dc.compile_stubs(SRC, DP_DIR, ["api", "podresources"], T)
import api_pb2 as pb  # noqa: E402
import api_pb2_grpc as pb_grpc  # noqa: E402
import podresources_pb2 as pr  # noqa: E402
import podresources_pb2_grpc as pr_grpc  # noqa: E402

# The daemon: its config (write_conf rewrites the budget), socket, pinctl and quota rules.
DAEMON = H.daemon
RUN, SOCK, CONF = DAEMON.run, DAEMON.sock, DAEMON.conf
write_conf, pinctl, start_daemon, rules = DAEMON.write_conf, DAEMON.pinctl, DAEMON.start, DAEMON.rules


# A stand-in kubelet: the Registration service on DP_KUBELET_DIR/kubelet.sock.
KDIR = os.path.join(T, "device-plugins")
os.mkdir(KDIR, 0o750)
registrations = queue.Queue()


class Kubelet(pb_grpc.RegistrationServicer):
    def Register(self, request, context):
        registrations.put(request)
        return pb.Empty()


kubelet = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(max_workers=4))
pb_grpc.add_RegistrationServicer_to_server(Kubelet(), kubelet)
kubelet.add_insecure_port("unix://" + os.path.join(KDIR, "kubelet.sock"))
kubelet.start()

# A stand-in for the kubelet's pod resources API: List answers with LISTED, a list of
# (namespace, name, [(container, resource, [device ids])]); FAIL_LIST set: List fails with that code.
LISTED = []
FAIL_LIST = []
list_calls = []


class PodResources(pr_grpc.PodResourcesListerServicer):
    def List(self, request, context):
        list_calls.append(time.monotonic())
        if FAIL_LIST:
            context.abort(FAIL_LIST[0], "stand-in kubelet: List failing on purpose")
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(namespace=ns, name=name, containers=[
                pr.ContainerResources(name=c, devices=[pr.ContainerDevices(resource_name=res, device_ids=ids)])
                for c, res, ids in conts])
            for ns, name, conts in LISTED])


PR_SOCK = os.path.join(T, "pod-resources", "kubelet.sock")
os.mkdir(os.path.dirname(PR_SOCK), 0o750)
podres = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(max_workers=4))
pr_grpc.add_PodResourcesListerServicer_to_server(PodResources(), podres)
podres.add_insecure_port("unix://" + PR_SOCK)
podres.start()
LOGS = os.path.join(T, "pods")  # the kubelet's /var/log/pods
os.mkdir(LOGS)


def pod_log(ns, name, uid):
    os.makedirs(os.path.join(LOGS, f"{ns}_{name}_{uid}", "job"), exist_ok=True)


CG = os.path.join(T, "cgroup")
POD_A = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"  # systemd driver, burstable
POD_B = "6fa459ea-ee8a-3ca4-894e-db77e160355e"  # cgroupfs driver, besteffort
CG_A = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + POD_A.replace("-", "_") + ".slice"
CG_B = "/kubepods/besteffort/pod" + POD_B
os.makedirs(CG + CG_A + "/cri-containerd-0123.scope")
os.makedirs(CG + "/kubepods.slice/kubepods-besteffort.slice")
os.makedirs(CG + "/system.slice/kubelet.service")


def write_checkpoint(entries):
    """The kubelet's kubelet_internal_checkpoint (1.20+: DeviceIDs per NUMA node), written whole."""
    tmp = os.path.join(KDIR, ".ckpt")
    with open(tmp, "w") as f:
        json.dump({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 0}, f)
    os.rename(tmp, os.path.join(KDIR, "kubelet_internal_checkpoint"))


def entry(uid, container, ids, resource=RESOURCE, numa=True):
    return {"PodUID": uid, "ContainerName": container, "ResourceName": resource,
            "DeviceIDs": {"-1": ids} if numa else ids, "AllocResp": ""}


def main():
    write_conf("3G")
    daemon = start_daemon()
    env = dict(os.environ, PINBROKER_SOCKET=SOCK, DP_KUBELET_DIR=KDIR, DP_CGROUP_ROOT=CG, DP_POLL_S="0.3",
               DP_SOCKET_DIR_HOST=RUN, PINCTL=PINCTL, DP_STUBS_DIR=STUBS, DP_POD_RESOURCES=PR_SOCK, DP_POD_LOGS=LOGS)
    plog = open(os.path.join(T, "plugin.log"), "w")
    plugin = subprocess.Popen([sys.executable, PLUGIN], env=env, stdout=plog, stderr=subprocess.STDOUT)
    procs.append(plugin)

    # 1. Registration.
    try:
        reg = registrations.get(timeout=20)
    except queue.Empty:
        fail("the plugin did not register within 20 s: " + open(plog.name).read())
    if (reg.version, reg.resource_name) != ("v1beta1", RESOURCE) or not reg.options.pre_start_required:
        fail(f"Register: {reg}")
    endpoint = os.path.join(KDIR, reg.endpoint)
    if os.path.dirname(endpoint) != KDIR or not os.path.exists(endpoint):
        fail(f"Register named endpoint {reg.endpoint!r}, not a socket in {KDIR}")
    ok(f"registered v1beta1 {RESOURCE} at {reg.endpoint}, pre_start_required")

    ch = grpc.insecure_channel("unix://" + endpoint)
    stub = pb_grpc.DevicePluginStub(ch)
    if not stub.GetDevicePluginOptions(pb.Empty(), timeout=5).pre_start_required:
        fail("GetDevicePluginOptions: pre_start_required is false")

    # 2. ListAndWatch: one device per GiB, updated on every budget change.
    lists = queue.Queue()
    stream = stub.ListAndWatch(pb.Empty())

    def reader():
        try:
            for r in stream:
                lists.put([(d.ID, d.health) for d in r.devices])
        except grpc.RpcError:
            pass

    threading.Thread(target=reader, daemon=True).start()

    def expect(n, health, why):
        end = time.monotonic() + 15
        last = None
        while time.monotonic() < end:
            try:
                last = lists.get(timeout=0.5)
            except queue.Empty:
                continue
            if len(last) == n and all(h == health for _, h in last) and len({i for i, _ in last}) == n:
                ok(f"{why}: {n} devices, {health}")
                return [i for i, _ in last]
        fail(f"{why}: expected {n} {health} devices, last list {last}")

    ids = expect(3, "Healthy", "budget 3G")
    write_conf("5G")
    daemon.send_signal(signal.SIGHUP)
    expect(5, "Healthy", "after a reload to budget 5G")
    pinctl("set", "budget", "4607M")
    ids = expect(4, "Healthy", "after pinctl set budget 4607M (rounded down)")

    # 3. Allocate: the socket folder and PINBROKER_SOCKET, no hostPath in the pod.
    resp = stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=ids[:2]), pb.ContainerAllocateRequest(devices_ids=ids[2:3])]), timeout=5)
    if len(resp.container_responses) != 2:
        fail(f"Allocate: {len(resp.container_responses)} container responses for 2 requests")
    for c, n in zip(resp.container_responses, (2, 1)):
        mounts = [(m.container_path, m.host_path, m.read_only) for m in c.mounts]
        if mounts != [("/run/pinbroker", RUN, True)]:
            fail(f"Allocate: mounts {mounts}, expected the socket folder {RUN} read-only at /run/pinbroker")
        if dict(c.envs) != {"PINBROKER_SOCKET": "/run/pinbroker/pinbroker.sock", "PINBROKER_PINNED_GIB": str(n)}:
            fail(f"Allocate: envs {dict(c.envs)}")
    ok("Allocate: /run/pinbroker mounted read-only from the node's socket folder, PINBROKER_SOCKET set")

    # 4. PreStartContainer: the pod's request as the pod resources API lists it (2 GiB over its init and
    # app containers, which share devices; another resource's entry does not count) becomes its cgroup's
    # quota. The checkpoint names another pod for those devices: it must not be read while List answers.
    pod_log("team-a", "train-0", POD_A)
    LISTED[:] = [("team-a", "train-0", [("init", RESOURCE, ids[:2]), ("train", RESOURCE, ids[:2]),
                                        ("train", "nvidia.com/gpu", ["GPU-0"])]),
                 ("team-a", "web-0", [("web", "nvidia.com/gpu", ["GPU-1"])])]
    write_checkpoint([entry(POD_B, "job", ids[:2])])
    n = len(list_calls)
    stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids[:2]), timeout=30)
    got = rules().get(CG_A)
    if got != 2 * GIB or len(list_calls) == n:
        fail(f"after PreStartContainer the quota of {CG_A} is {got}, expected {2 * GIB} ({len(list_calls) - n} "
             f"List calls): {rules()}")
    if CG_B in rules():
        fail(f"the plugin read the checkpoint while the pod resources API answered: {rules()}")
    ok(f"PreStartContainer: List names team-a/train-0, its log folder its UID: quota 2 GiB for {CG_A}")

    # 5. The poll finds a pod the kubelet never announced (cgroupfs layout), whose name has an earlier
    # pod's log folder beside its own (the earlier pod's cgroup gone): the UID with a cgroup is taken.
    os.makedirs(CG + CG_B)
    pod_log("team-b", "job-0", POD_B)
    pod_log("team-b", "job-0", "9a7b6c5d-0000-4000-8000-00000000000b")
    LISTED.append(("team-b", "job-0", [("job", RESOURCE, ids[2:3])]))
    wait_for(f"the poll setting the quota of {CG_B}", lambda: rules().get(CG_B) == GIB)
    if rules().get(CG_A) != 2 * GIB:
        fail(f"pod A's quota changed: {rules()}")
    ok(f"poll: quota 1 GiB for {CG_B} (cgroupfs driver; of two log folders for team-b/job-0, the one with a cgroup)")

    # 6. The daemon down: devices unhealthy, the plugin alive and answering, PreStartContainer
    # failing open; back up: healthy, and the quotas the new daemon forgot are set again.
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout=20)
    expect(4, "Unhealthy", "daemon down")
    stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids[:2]), timeout=30)
    if plugin.poll() is not None:
        fail(f"the plugin exited ({plugin.returncode}) with the daemon down")
    ok("daemon down: PreStartContainer answers (fails open), the plugin keeps running")
    write_conf("4G")
    daemon = start_daemon()
    expect(4, "Healthy", "daemon back")
    wait_for("quotas set again after the daemon restarted",
             lambda: rules().get(CG_A) == 2 * GIB and rules().get(CG_B) == GIB)
    ok("daemon restarted: both pods' quotas set again")

    # A List that fails (a kubelet restarting: the socket is there) clears nothing, stops nothing, and
    # does not send the plugin to the checkpoint (which names neither pod now).
    write_checkpoint([])
    FAIL_LIST[:] = [grpc.StatusCode.UNAVAILABLE]
    wait_for("two polls with List failing",
             lambda: open(plog.name).read().count("List failing on purpose") >= 2)
    FAIL_LIST[:] = []
    if rules().get(CG_A) != 2 * GIB or rules().get(CG_B) != GIB or plugin.poll() is not None:
        fail(f"a failing List changed the quotas or stopped the plugin: {rules()}")
    ok("List failing (UNAVAILABLE): quotas kept, the checkpoint not read, the plugin runs on")

    # 7. A pod the kubelet no longer lists: its rule is cleared; the other stays.
    LISTED[:] = [p for p in LISTED if p[1] != "job-0"]
    wait_for(f"the rule of {CG_B} cleared once its pod left List", lambda: CG_B not in rules())
    if rules().get(CG_A) != 2 * GIB:
        fail(f"pod A's quota changed when pod B left: {rules()}")
    ok(f"pod B gone from List: the rule of {CG_B} cleared, pod A's kept")

    # 8. Enforcement on a real cgroup of this host (the daemon reads the client's /proc/PID/cgroup):
    # a pod cgroup the plugin finds under the host's cgroup root, whose client cannot pass 2 GiB.
    real_check(env, ids)

    strict_check(env)
    fallback_check(env, ids)

    # 9. A restarted kubelet empties its folder: the plugin registers again.
    os.unlink(endpoint)
    try:
        registrations.get(timeout=15)
    except queue.Empty:
        fail("no new Register within 15 s of the plugin's socket being removed")
    ok("re-registered after the kubelet emptied its folder")

    # 10. SIGTERM: exit 0, its socket gone.
    plugin.send_signal(signal.SIGTERM)
    try:
        rc = plugin.wait(timeout=10)
    except subprocess.TimeoutExpired:
        fail("the plugin still runs 10 s after SIGTERM")
    if rc != 0 or os.path.exists(endpoint):
        fail(f"SIGTERM: exit {rc}, socket left: {os.path.exists(endpoint)}")
    ok("SIGTERM: exit 0, socket removed")
    print("PASS: device plugin")


def plugin_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dp", PLUGIN)
    dp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dp)
    return dp


def fallback_check(env, ids):
    """Kubelets without the pod resources API v1: no socket (before 1.15, or not mounted) or one serving
    v1alpha1 only (1.15 to 1.19: a v1 List is UNIMPLEMENTED): the device checkpoint names the pods (the
    1.20+ form and the older list), as auto does; with DP_POD_SOURCE=podresources the checkpoint is never read."""
    dp = plugin_module()
    pod_c = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
    cg_c = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + pod_c.replace("-", "_") + ".slice"
    os.makedirs(CG + cg_c, exist_ok=True)
    write_checkpoint([entry(pod_c, "job", ids[3:4], numa=False)])
    bare = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(max_workers=2))
    old_sock = os.path.join(T, "v1alpha1-only.sock")  # a server with no v1 service: List is UNIMPLEMENTED
    bare.add_insecure_port("unix://" + old_sock)
    bare.start()
    try:
        for sock, why in ((os.path.join(T, "no-such.sock"), "no socket"), (old_sock, "no v1 service")):
            pinctl("quota", "clear", cg_c, check=False)
            p = dp.Plugin(dp.Config(dict(env, DP_POD_RESOURCES=sock)), pb, pb_grpc, pr, pr_grpc)
            if not p.reconcile_quotas(ids[3:4]) or rules().get(cg_c) != GIB or p.source != "checkpoint":
                fail(f"{why}: the checkpoint's pod got no 1 GiB quota (source {p.source}): {rules()}")
            ok(f"pod resources API missing ({why}): the checkpoint's pod got its quota")
        pinctl("quota", "clear", cg_c)
        p = dp.Plugin(dp.Config(dict(env, DP_POD_RESOURCES=os.path.join(T, "no-such.sock"),
                                     DP_POD_SOURCE="podresources")), pb, pb_grpc, pr, pr_grpc)
        if p.reconcile_quotas(ids[3:4]) or cg_c in rules():
            fail(f"DP_POD_SOURCE=podresources without the socket read the checkpoint: {rules()}")
        ok("DP_POD_SOURCE=podresources without the socket: no quota from the checkpoint")
    finally:
        bare.stop(0)


def strict_check(env):
    """DP_STRICT=1: a PreStartContainer whose quota cannot be set fails (the container does not
    start); without it the same call succeeds."""
    dp = plugin_module()

    class Ctx:
        def abort(self, code, details):
            raise RuntimeError(f"{code.name}: {details}")

    req = pb.PreStartContainerRequest(devices_ids=["gib-99"])  # in no pod of the checkpoint
    dp.make_servicer(dp.Plugin(dp.Config(env), pb, pb_grpc, pr, pr_grpc)).PreStartContainer(req, Ctx())
    try:
        dp.make_servicer(dp.Plugin(dp.Config(dict(env, DP_STRICT="1")), pb, pb_grpc, pr, pr_grpc)).PreStartContainer(req, Ctx())
    except RuntimeError as e:
        if "FAILED_PRECONDITION" not in str(e):
            fail(f"DP_STRICT=1: PreStartContainer failed with {e}")
        ok(f"DP_STRICT=1: PreStartContainer without a quota fails: {e}")
        return
    fail("DP_STRICT=1: PreStartContainer succeeded without setting a quota")


def real_check(env, ids):
    """A real pod-named cgroup on this host: set by the plugin (cgroup root /sys/fs/cgroup), then
    a client moved into it is refused an acquire past its pod's quota."""
    uid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    made = dc.make_pod_cgroup("kubepods-pinbroker-test", uid, real_cgroups)
    if not made:
        return
    base, rel = made
    pod_log("team-r", "real-0", uid)
    LISTED[:] = [("team-a", "train-0", [("train", RESOURCE, ids[:2])]), ("team-r", "real-0", [("job", RESOURCE, ids[2:4])])]
    # The running plugin looks in the fake tree: this host's tree is searched by the plugin's own
    # code, loaded here, with DP_CGROUP_ROOT=/sys/fs/cgroup.
    dp = plugin_module()
    cfg = dp.Config(dict(env, DP_CGROUP_ROOT="/sys/fs/cgroup"))
    path = dp.pod_cgroup(cfg, uid)
    if path != rel:
        fail(f"pod_cgroup found {path} for the real cgroup {base + rel}")
    p = dp.Plugin(cfg, pb, pb_grpc, pr, pr_grpc)
    if not p.reconcile_quotas(ids[2:4]) or rules().get(rel) != 2 * GIB:
        fail(f"the real pod cgroup {rel} got no 2 GiB quota: {rules()}")
    # A client in that cgroup: 1 GiB fits, 3 GiB more does not.
    msg = dc.acquire_in_cgroup(PINCTL, SOCK, base + rel, rel, "3G", True, "quota 2 GiB")
    ok(f"real cgroup: quota 2 GiB set by the plugin; a 3G acquire there refused: {msg}")
    dc.acquire_in_cgroup(PINCTL, SOCK, base + rel, rel, "1G", False, "quota 2 GiB")
    ok("real cgroup: a 1G acquire there succeeds")


try:
    main()
finally:
    cleanup()
