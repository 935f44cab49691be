#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# pinbroker's kubelet device plugin (API v1beta1): advertises the node's pinned budget as
# pinbroker.io/pinned-gib (one device per whole GiB of `pinctl status --json`'s budget_bytes),
# gives each container that requests it the daemon's socket folder (a device-plugin Mount, so the
# pod needs no hostPath) and PINBROKER_SOCKET, and makes the pod's request its job quota:
# `pinctl quota set POD-CGROUP BYTES` for the pod's cgroup, from PreStartContainer (before the
# container's first process runs) and again every poll (a daemon restart forgets `set` rules).
# For clusters before Kubernetes 1.34; from 1.34 on, the DRA driver (deploy/kubernetes/dra) does this
# with a ResourceClaim per pod (docs/kubernetes.md, which to use).
#
# Which pod a device went to: the kubelet's pod resources API (List on its pod-resources socket, v1)
# names the pod (namespace and name) and container holding each device; the pod's UID, which names its
# cgroup, is in the name of the pod's log folder the kubelet keeps, /var/log/pods/NAMESPACE_NAME_UID
# (the layout node log agents read). Kubelets without that API (before 1.20: the socket is missing, or
# serves v1alpha1 only) fall back to the kubelet's device checkpoint,
# DEVICE_PLUGIN_DIR/kubelet_internal_checkpoint, which records the pod UID itself.
#
# Environment (defaults are what the DaemonSet gives):
#   PINBROKER_SOCKET      the daemon's socket, for pinctl (default /run/pinbroker/pinbroker.sock)
#   DP_KUBELET_DIR        the kubelet's device-plugins folder (default /var/lib/kubelet/device-plugins)
#   DP_POD_RESOURCES      the kubelet's pod resources socket (default /var/lib/kubelet/pod-resources/kubelet.sock)
#   DP_POD_LOGS           the kubelet's pod log folders (default /var/log/pods)
#   DP_POD_SOURCE         auto (default: the pod resources API, the checkpoint where the kubelet lacks it),
#                         podresources or checkpoint (that one only)
#   DP_RESOURCE           default pinbroker.io/pinned-gib
#   DP_SOCKET_DIR_HOST    the node's socket folder, mounted into client containers (default /run/pinbroker)
#   DP_SOCKET_DIR         where client containers see it (default /run/pinbroker)
#   DP_CGROUP_ROOT        the host's cgroup mount as this container sees it (default /sys/fs/cgroup)
#   DP_POLL_S             seconds between budget polls and quota repairs (default 10)
#   DP_STRICT             1: PreStartContainer fails (the container does not start) when the quota
#                         cannot be set; default 0: the pod runs bounded by the budget alone, logged
#   PINCTL                default pinctl
import json
import os
import sys
import threading

import grpc

API_VERSION = "v1beta1"
CHECKPOINT = "kubelet_internal_checkpoint"
HERE = os.path.dirname(os.path.abspath(__file__))
# pinbroker_k8s.py: beside this file in the image, in ../lib in the source tree.
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "lib")]
import pinbroker_k8s as k8s  # noqa: E402

GIB = k8s.GIB


def log(msg):
    print(f"pinbroker-device-plugin: {msg}", file=sys.stderr, flush=True)


def load_stubs():
    """(api_pb2, api_pb2_grpc, podresources_pb2, podresources_pb2_grpc): from DP_STUBS_DIR or this folder (the
    image generates them at build time), else generated now from the vendored protos."""
    try:
        s = k8s.load_stubs(HERE, ["api", "podresources"], "DP_STUBS_DIR")
    except (ImportError, RuntimeError) as e:
        sys.exit(f"pinbroker-device-plugin: no gRPC stubs: {e} (apt-get install python3-grpc-tools)")
    return s["api"] + s["podresources"]


class Config(k8s.AgentConfig):
    def __init__(self, env):
        super().__init__(env, "DP")
        self.kubelet_dir = env.get("DP_KUBELET_DIR", "/var/lib/kubelet/device-plugins")
        self.pod_resources = env.get("DP_POD_RESOURCES", "/var/lib/kubelet/pod-resources/kubelet.sock")
        self.pod_logs = env.get("DP_POD_LOGS", "/var/log/pods")
        self.pod_source = env.get("DP_POD_SOURCE", "auto")
        self.resource = env.get("DP_RESOURCE", "pinbroker.io/pinned-gib")
        # The endpoint is a file name in the kubelet's folder, unique to this resource.
        self.endpoint = "pinbroker-" + self.resource.rsplit("/", 1)[-1] + ".sock"
        if self.pod_source not in ("auto", "podresources", "checkpoint"):
            raise ValueError(f"DP_POD_SOURCE must be auto, podresources or checkpoint, not {self.pod_source}")


def pinctl(cfg, *args):
    """Run pinctl; its stdout, or raise RuntimeError with its own message."""
    return k8s.pinctl(cfg.pinctl, cfg.socket, *args)


def checkpoint_pods(cfg):
    """{pod UID: set of our device ids} from the kubelet's checkpoint (every container of the pod;
    an init container's devices are reused by the app containers, hence a set). DeviceIDs is a
    map of NUMA node to ids since kubelet 1.20, a list before. None when it cannot be read (not
    "no pods": that would clear every quota)."""
    path = os.path.join(cfg.kubelet_dir, CHECKPOINT)
    try:
        with open(path) as f:
            data = json.load(f)["Data"]
        pods = {}
        for e in data.get("PodDeviceEntries") or []:
            if e.get("ResourceName") != cfg.resource or not e.get("PodUID"):
                continue
            ids = e.get("DeviceIDs") or []
            if isinstance(ids, dict):
                ids = [i for per_numa in ids.values() for i in per_numa or []]
            pods.setdefault(str(e["PodUID"]), set()).update(str(i) for i in ids)
        return pods
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log(f"cannot read the kubelet's checkpoint {path}: {e!r}")
        return None


def pod_log_uids(cfg):
    """{(namespace, name): [UID, ...]} from the kubelet's pod log folders, NAMESPACE_NAME_UID (neither a
    namespace nor a pod name can hold '_'). Several UIDs for one name: an earlier pod of that name whose
    folder is not yet collected."""
    uids = {}
    try:
        names = os.listdir(cfg.pod_logs)
    except OSError as e:
        raise RuntimeError(f"cannot list the kubelet's pod log folders {cfg.pod_logs}: {e.strerror}") from None
    for n in names:
        parts = n.split("_")
        if len(parts) == 3 and all(parts):
            uids.setdefault((parts[0], parts[1]), []).append(parts[2])
    return uids


def pod_cgroup(cfg, uid):
    """The pod's cgroup path as the daemon names it, or None if it is not there (yet)."""
    return k8s.pod_cgroups(cfg.cgroup_root).get(k8s.cgroup_key(uid))


class Plugin:
    """The state the gRPC handlers and the poller share, under one condition variable."""

    def __init__(self, cfg, pb, pb_grpc, pr=None, pr_grpc=None):
        self.cfg = cfg
        self.pb = pb
        self.pb_grpc = pb_grpc
        self.pr, self.pr_grpc = pr, pr_grpc  # the pod resources API's stubs
        self.cond = threading.Condition()
        self.gib = 0  # the last budget seen, in whole GiB
        self.healthy = False
        self.version = 0  # bumped on every change ListAndWatch must send
        self.stopping = False
        self.quota_lock = threading.Lock()
        self.set_paths = {}  # pod UID -> the cgroup path whose rule this plugin set
        self.warned_cgns = False  # the daemon's cgroup namespace is unresolved, and that was logged
        self.source = None  # where the last pod list came from: "podresources" or "checkpoint"
        self.pr_channel = None
        self.uid_names = {}  # pod UID -> (namespace, name), as resolved from the pod resources API
        self.listed = set()  # the (namespace, name) of every pod holding our devices in the last List

    def podresources_pods(self):
        """{(namespace, name): set of our device ids} from the kubelet's pod resources API (List, v1), over
        all the pod's containers (an init container's devices are reused by the app containers, hence a set).
        Raises grpc.RpcError."""
        if self.pr is None:
            s = k8s.load_stubs(HERE, ["podresources"], "DP_STUBS_DIR")["podresources"]
            self.pr, self.pr_grpc = s
        if self.pr_channel is None:
            self.pr_channel = grpc.insecure_channel("unix://" + self.cfg.pod_resources)
        resp = self.pr_grpc.PodResourcesListerStub(self.pr_channel).List(self.pr.ListPodResourcesRequest(), timeout=10)
        pods = {}
        for p in resp.pod_resources:
            ids = {i for c in p.containers for d in c.devices if d.resource_name == self.cfg.resource for i in d.device_ids}
            if ids:
                pods[(p.namespace, p.name)] = ids
        return pods

    def pods_by_uid(self, named, cgroups):
        """{UID: ids} for the pods of named ({(namespace, name): ids}), each UID from the kubelet's pod log
        folders; of several UIDs for one name (an earlier pod of that name), the one whose cgroup exists.
        A pod left unresolved is logged and left out (the next poll tries again)."""
        try:
            uids = pod_log_uids(self.cfg)
        except RuntimeError as e:
            log(str(e))
            return None
        pods = {}
        for (ns, name), ids in sorted(named.items()):
            cands = uids.get((ns, name), [])
            if len(cands) > 1:
                cands = [u for u in cands if k8s.cgroup_key(u) in cgroups]
            if len(cands) == 1:
                pods[cands[0]] = ids
                self.uid_names[cands[0]] = (ns, name)
            else:
                log(f"pod {ns}/{name}: {'no' if not cands else len(cands)} UIDs for it in {self.cfg.pod_logs}"
                    f"{' with a cgroup' if cands else ''}: quota not set now")
        return pods

    def pod_devices(self, cgroups_fn):
        """{pod UID: set of our device ids} from the pod resources API, or from the checkpoint where the kubelet
        has no such API (DP_POD_SOURCE=auto) or where DP_POD_SOURCE=checkpoint says so; None when neither can
        say now (which must change no quota). cgroups_fn() gives pod_cgroups, read only when needed."""
        use = self.cfg.pod_source
        if use != "checkpoint":
            try:
                named = self.podresources_pods()
                use = "podresources"
            except grpc.RpcError as e:
                absent = not os.path.exists(self.cfg.pod_resources)
                old = e.code() == grpc.StatusCode.UNIMPLEMENTED  # a kubelet serving v1alpha1 only (before 1.20)
                if use == "auto" and (absent or old):
                    use = "checkpoint"
                    if self.source != use:
                        why = "does not exist" if absent else "does not serve podresources v1 (a kubelet before 1.20)"
                        log(f"the kubelet's pod resources socket {self.cfg.pod_resources} {why}: "
                            "reading its device checkpoint instead")
                else:
                    log(f"the kubelet's pod resources API ({self.cfg.pod_resources}): {e.code().name}: "
                        f"{e.details()}: no quota changed now")
                    return None
        if use == "checkpoint":
            pods = checkpoint_pods(self.cfg)
            self.listed = set()
        else:
            pods = self.pods_by_uid(named, cgroups_fn()) if named else {}
            self.listed = set(named)
        if pods is not None and self.source != use:
            if use == "podresources":
                log(f"pods and their devices from the kubelet's pod resources API at {self.cfg.pod_resources}")
            self.source = use
        return pods

    def poll_budget(self):
        try:
            budget, unresolved = k8s.budget_status(self.cfg.pinctl, self.cfg.socket)
            gib, healthy = budget // GIB, True
            # The daemon reads clients' cgroups in a cgroup namespace of its own that it could not place in the
            # host's tree: the quotas set here name host paths and would not bind.
            if unresolved and not self.warned_cgns:
                log(k8s.CGNS_WARNING)
            self.warned_cgns = unresolved
        except RuntimeError as e:
            gib, healthy = self.gib, False
            if self.healthy:
                log(f"the daemon does not answer, devices unhealthy: {e}")
        with self.cond:
            if (gib, healthy) != (self.gib, self.healthy):
                if healthy:
                    log(f"budget {gib} GiB: advertising {gib} devices of {self.cfg.resource}")
                self.gib, self.healthy = gib, healthy
                self.version += 1
                self.cond.notify_all()

    def devices(self):
        health = "Healthy" if self.healthy else "Unhealthy"
        return [self.pb.Device(ID=f"gib-{i}", health=health) for i in range(self.gib)]

    def reconcile_quotas(self, device_ids=None):
        """Set the quota of every pod holding our devices whose rule the daemon lacks or has at
        another size. With device_ids, return whether the pod holding them got its quota."""
        with self.quota_lock:
            cache = {}

            def cgroups():
                if "c" not in cache:
                    cache["c"] = k8s.pod_cgroups(self.cfg.cgroup_root)
                return cache["c"]

            pods = self.pod_devices(cgroups)
            if pods is None:
                return False
            try:
                rules = k8s.quota_rules(self.cfg.pinctl, self.cfg.socket)
            except RuntimeError as e:
                if device_ids is not None or pods:
                    log(f"cannot read the daemon's quotas, none set now: {e}")
                return False
            done = device_ids is None
            for uid, ids in sorted(pods.items()):
                mine = device_ids is not None and set(device_ids) <= ids
                path = cgroups().get(k8s.cgroup_key(uid))
                if path is None:
                    if mine:
                        log(f"pod {uid}: no cgroup named for it under {self.cfg.cgroup_root} yet: quota not set")
                    continue
                if not k8s.set_pod_quota(self.cfg.pinctl, self.cfg.socket, rules, uid, path, len(ids) * GIB,
                                         f"{len(ids)} GiB", log):
                    continue
                self.set_paths[uid] = path
                done = done or mine
            # A pod the kubelet no longer lists is gone: clear its rule (the daemon
            # also releases a rule once it saw its cgroup and the cgroup went, where it can see it).
            # (A pod the API still lists whose UID was not resolved this time is not gone.)
            for uid in [u for u in self.set_paths if u not in pods and self.uid_names.get(u) not in self.listed]:
                self.uid_names.pop(uid, None)
                k8s.clear_pod_quota(self.cfg.pinctl, self.cfg.socket, rules, uid, self.set_paths.pop(uid), "is gone",
                                    log)
            if device_ids is not None and not done and not any(set(device_ids) <= ids for ids in pods.values()):
                log(f"devices {sorted(device_ids)} are held by no pod the kubelet names ({self.source}): quota not set")
            return done


def make_servicer(plugin):
    pb, cfg = plugin.pb, plugin.cfg

    class Servicer(plugin.pb_grpc.DevicePluginServicer):
        def GetDevicePluginOptions(self, request, context):
            return pb.DevicePluginOptions(pre_start_required=True)

        def ListAndWatch(self, request, context):
            seen = -1
            while context.is_active():
                with plugin.cond:
                    if plugin.stopping:
                        return
                    if plugin.version == seen:
                        plugin.cond.wait(timeout=1)
                        continue
                    seen = plugin.version
                    devs = plugin.devices()
                yield pb.ListAndWatchResponse(devices=devs)

        def GetPreferredAllocation(self, request, context):
            return pb.PreferredAllocationResponse(container_responses=[
                pb.ContainerPreferredAllocationResponse(deviceIDs=list(r.available_deviceIDs)[:r.allocation_size])
                for r in request.container_requests])

        def Allocate(self, request, context):
            resps = []
            for r in request.container_requests:
                log(f"allocate {len(r.devices_ids)} GiB")
                resps.append(pb.ContainerAllocateResponse(
                    envs={"PINBROKER_SOCKET": os.path.join(cfg.sock_dir, os.path.basename(cfg.socket)),
                          "PINBROKER_PINNED_GIB": str(len(r.devices_ids))},
                    # Read-only: connect() needs no write access to the folder.
                    mounts=[pb.Mount(container_path=cfg.sock_dir, host_path=cfg.sock_dir_host, read_only=True)]))
            return pb.AllocateResponse(container_responses=resps)

        def PreStartContainer(self, request, context):
            ok = plugin.reconcile_quotas(list(request.devices_ids))
            if not ok and cfg.strict:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "pinbroker: the pod's pinned quota could not be set (DP_STRICT=1)")
            return pb.PreStartContainerResponse()

    return Servicer()


def start_and_register(plugin):
    cfg, pb = plugin.cfg, plugin.pb
    path = os.path.join(cfg.kubelet_dir, cfg.endpoint)
    server = k8s.grpc_server(path, lambda srv: plugin.pb_grpc.add_DevicePluginServicer_to_server(make_servicer(plugin),
                                                                                                srv))
    try:
        with grpc.insecure_channel("unix://" + os.path.join(cfg.kubelet_dir, "kubelet.sock")) as ch:
            plugin.pb_grpc.RegistrationStub(ch).Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=cfg.endpoint, resource_name=cfg.resource,
                options=pb.DevicePluginOptions(pre_start_required=True)), timeout=10)
    except grpc.RpcError as e:
        server.stop(0)
        raise RuntimeError(f"registering with the kubelet failed: {e.code().name}: {e.details()}") from None
    log(f"registered {cfg.resource} with the kubelet at {cfg.kubelet_dir}/kubelet.sock, serving {path}")
    return server, os.stat(path).st_ino


def main():
    cfg = k8s.read_config(Config, log)
    if cfg is None:
        return 2
    pb, pb_grpc, pr, pr_grpc = load_stubs()
    plugin = Plugin(cfg, pb, pb_grpc, pr, pr_grpc)
    stop = k8s.stop_event()

    def one_round():
        plugin.poll_budget()
        plugin.reconcile_quotas()

    plugin.poll_budget()
    threading.Thread(target=k8s.poll_until, args=(stop, cfg.poll_s, one_round, log), daemon=True).start()
    server = None
    sock = os.path.join(cfg.kubelet_dir, cfg.endpoint)
    while not stop.is_set():
        if server is None:
            try:
                server, ino = start_and_register(plugin)
            except (RuntimeError, OSError) as e:
                log(f"{e}; retrying in 5 s")
                stop.wait(5)
                continue
        stop.wait(1)
        # A restarted kubelet empties its folder: register again when our socket is gone.
        try:
            gone = os.stat(sock).st_ino != ino
        except FileNotFoundError:
            gone = True
        if gone and not stop.is_set():
            log("the kubelet removed our socket (it restarted): registering again")
            server.stop(1)
            server = None
    with plugin.cond:
        plugin.stopping = True
        plugin.cond.notify_all()
    if server is not None:
        server.stop(1).wait()
    k8s.unlink_quietly(sock)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
