#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# pinbroker's DRA driver (dynamic resource allocation, resource.k8s.io/v1, Kubernetes 1.34+): a kubelet plugin
# that publishes the node's pinned budget in a ResourceSlice and makes a pod's ResourceClaim for pinned bytes
# its job quota in the daemon.
#
# - The slice. One ResourceSlice per node (name NODE-DRIVER, pool NODE, owned by the Node), written through the
#   API server: by default one device, "pinned", whose capacity "memory" is the daemon's budget
#   (`pinctl status --json`'s budget_bytes), shared by every claim (allowMultipleAllocations: consumable
#   capacity, on by default from Kubernetes 1.36, the DRAConsumableCapacity feature gate in 1.34 and 1.35):
#   a claim asks for `capacity: {requests: {memory: 4Gi}}` and the scheduler puts the pod where that much
#   budget is unallocated. DRA_DEVICES=gib publishes one device per whole GiB instead (at most 128), each of
#   capacity 1Gi, for clusters without consumable capacity: a claim then asks for `count: 4`. Updated on every
#   budget change (a reload, `pinctl set budget`), the pool's generation increased.
# - The claim. The kubelet calls NodePrepareResources (the kubelet plugin API dra/v1) with each claim's
#   namespace, name and UID before the pod's sandbox exists (its cgroup does); the driver reads the claim from
#   the API server: the bytes allocated on this node's pool (a result's consumedCapacity["memory"], or the whole
#   device's capacity when it was allocated whole) and the pods it is reserved for (status.reservedFor). Each such
#   pod's quota is the sum of its prepared claims: `pinctl quota set POD-CGROUP BYTES` on its cgroup, found by
#   its UID in the host's cgroup tree as the device plugin does. NodeUnprepareResources (after the pod's
#   containers stopped) drops the claim, and a pod left with no claim has its rule cleared. The prepared claims
#   are kept in DRA_PLUGIN_DIR/claims.json, so a restarted driver still knows them; every poll sets again a
#   rule the daemon lacks (a restarted daemon forgets `set` rules).
# - The socket. Each prepared device carries the CDI device pinbroker.io/pinned-memory=socket, from a CDI spec
#   this driver writes in DRA_CDI_DIR: the container runtime (containerd 1.7+ with CDI on, CRI-O) mounts the
#   node's socket folder read-only into the container and sets PINBROKER_SOCKET, so the pod needs no hostPath.
# - Registration. A Registration server (pluginregistration/v1) on DRA_REGISTRY_DIR/DRIVER-reg.sock, which the
#   kubelet's plugin watcher finds: GetInfo names the driver, type DRAPlugin, its DRA socket
#   DRA_PLUGIN_DIR/dra.sock, and the service it serves, v1.DRAPlugin.
#
# Environment (defaults are what deploy/overlays/dra gives):
#   NODE_NAME           this node's name (the downward API's spec.nodeName); required
#   PINBROKER_SOCKET    the daemon's socket, for pinctl (default /run/pinbroker/pinbroker.sock)
#   PINCTL              default pinctl
#   DRA_DRIVER          the driver's name (default pinned-memory.pinbroker.io), the DeviceClass's selector
#   DRA_PLUGIN_DIR      its DRA socket and state (default /var/lib/kubelet/plugins/DRIVER)
#   DRA_REGISTRY_DIR    the kubelet's plugin registry (default /var/lib/kubelet/plugins_registry)
#   DRA_CDI_DIR         where the CDI spec goes (default /var/run/cdi)
#   DRA_SOCKET_DIR_HOST the node's socket folder, mounted into client containers (default /run/pinbroker)
#   DRA_SOCKET_DIR      where client containers see it (default /run/pinbroker)
#   DRA_CGROUP_ROOT     the host's cgroup mount as this container sees it (default /sys/fs/cgroup)
#   DRA_DEVICES         shared (default) or gib, as above
#   DRA_POLL_S          seconds between budget polls, slice updates and quota repairs (default 10)
#   DRA_STRICT          1: a claim whose pod's quota cannot be set fails to prepare (the kubelet retries, the
#                       pod waits); default 0: the pod runs bounded by the budget alone, logged
#   DRA_API_URL         the API server (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)
#   DRA_TOKEN_FILE      default /var/run/secrets/kubernetes.io/serviceaccount/token (read again for each request)
#   DRA_CA_FILE         default /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
import json
import os
import re
import ssl
import sys
import threading
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
# pinbroker_k8s.py: beside this file in the image, in ../lib in the source tree.
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "lib")]
import pinbroker_k8s as k8s  # noqa: E402

GIB = k8s.GIB
STEP = 2 << 20  # the daemon's chunk: capacity is offered and asked for in 2 MiB steps
CAPACITY = "memory"  # the capacity's name in the slice and in claims (the driver's own domain)
CDI_KIND = "pinbroker.io/pinned-memory"
CDI_DEVICE = CDI_KIND + "=socket"
SERVICE = "v1.DRAPlugin"  # the kubelet's name for the dra/v1 gRPC service, as registration lists it
MAX_DEVICES = 128  # per ResourceSlice
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def log(msg):
    print(f"pinbroker-dra-driver: {msg}", file=sys.stderr, flush=True)


class Config(k8s.AgentConfig):
    def __init__(self, env):
        super().__init__(env, "DRA")
        self.node = env.get("NODE_NAME", "")
        self.driver = env.get("DRA_DRIVER", "pinned-memory.pinbroker.io")
        self.plugin_dir = env.get("DRA_PLUGIN_DIR", "/var/lib/kubelet/plugins/" + self.driver)
        self.registry_dir = env.get("DRA_REGISTRY_DIR", "/var/lib/kubelet/plugins_registry")
        self.cdi_dir = env.get("DRA_CDI_DIR", "/var/run/cdi")
        self.devices = env.get("DRA_DEVICES", "shared")
        host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"
        self.api = env.get("DRA_API_URL", f"https://{host}:{port}" if host else "").rstrip("/")
        self.token_file = env.get("DRA_TOKEN_FILE", SA_DIR + "/token")
        self.ca_file = env.get("DRA_CA_FILE", SA_DIR + "/ca.crt")
        if not self.node:
            raise ValueError("NODE_NAME is not set: give the container the downward API's spec.nodeName")
        if not self.api:
            raise ValueError("no API server: set DRA_API_URL (KUBERNETES_SERVICE_HOST is not set either)")
        if self.devices not in ("shared", "gib"):
            raise ValueError(f"DRA_DEVICES must be shared or gib, not {self.devices!r}")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+", self.driver) \
                or len(self.driver) > 63:
            raise ValueError(f"DRA_DRIVER {self.driver!r} is not a DNS subdomain of at most 63 characters "
                             "with a domain (such as pinned-memory.example.com)")
        self.slice_name = f"{self.node}-{self.driver}"
        self.dra_socket = os.path.join(self.plugin_dir, "dra.sock")
        self.reg_socket = os.path.join(self.registry_dir, self.driver + "-reg.sock")
        self.state_file = os.path.join(self.plugin_dir, "claims.json")


_QTY = re.compile(r"([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
_MULT = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
         "n": 10**-9, "u": 10**-6, "m": 10**-3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
         "E": 10**18}


def quantity(q):
    """A Kubernetes quantity ("4Gi", "1.5G", "4096", "4e9") in whole units, rounded up; ValueError if not one."""
    from decimal import ROUND_CEILING, Decimal, InvalidOperation

    m = _QTY.fullmatch(str(q).strip())
    if not m:
        raise ValueError(f"not a quantity: {q!r}")
    try:
        num = Decimal(m.group(1))
    except InvalidOperation:
        raise ValueError(f"not a quantity: {q!r}") from None
    suf = m.group(2)
    mult = Decimal(10) ** int(suf[1:]) if suf and suf[0] in "eE" else Decimal(str(_MULT[suf]))
    return int((num * mult).to_integral_value(rounding=ROUND_CEILING))


class ApiError(Exception):
    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


class Api:
    """Just enough of an API server client: JSON over HTTPS with the service account's token."""

    def __init__(self, cfg):
        self.cfg = cfg

    def call(self, method, path, body=None):
        try:
            with open(self.cfg.token_file) as f:
                token = f.read().strip()
        except OSError as e:
            raise ApiError(0, f"cannot read the API token {self.cfg.token_file}: {e.strerror}") from None
        req = urllib.request.Request(self.cfg.api + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Bearer " + token, "Accept": "application/json",
                                              "Content-Type": "application/json"})
        try:
            ctx = ssl.create_default_context(cafile=self.cfg.ca_file) if self.cfg.api.startswith("https:") else None
            with urllib.request.urlopen(req, timeout=15, context=ctx) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read()).get("message", "")
            except (ValueError, AttributeError, OSError):
                msg = ""
            hint = " (check the ClusterRole in deploy/overlays/dra/rbac.yaml)" if e.code == 403 else ""
            raise ApiError(e.code, f"{method} {path}: HTTP {e.code}: {msg or e.reason}{hint}") from None
        except (urllib.error.URLError, OSError, ssl.SSLError, ValueError) as e:
            raise ApiError(0, f"{method} {path}: {getattr(e, 'reason', e)}") from None


class Driver:
    """The state the gRPC handlers and the poller share."""

    def __init__(self, cfg, dra, dra_grpc, api=None):
        self.cfg = cfg
        self.dra, self.dra_grpc = dra, dra_grpc
        self.api = api or Api(cfg)
        self.lock = threading.RLock()
        self.budget = None  # bytes, the last budget the daemon gave
        self.published = None  # the devices of the slice as last written
        self.node_uid = None
        self.claims = self.load_state()  # claim UID -> {"namespace", "name", "bytes", "pods", "devices"}
        self.set_paths = {}  # pod UID -> the cgroup path whose rule this driver set
        self.warned = set()

    # The prepared claims, kept across restarts of the driver (the kubelet does not prepare them again).
    def load_state(self):
        try:
            with open(self.cfg.state_file) as f:
                claims = json.load(f)["claims"]
            if not isinstance(claims, dict):
                raise TypeError("claims is not an object")
            return claims
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            log(f"cannot read {self.cfg.state_file} ({e!r}): starting with no prepared claims")
            return {}

    def save_state(self):
        tmp = self.cfg.state_file + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"claims": self.claims}, f)
            os.rename(tmp, self.cfg.state_file)
        except OSError as e:
            log(f"cannot write {self.cfg.state_file}: {e.strerror}: a restarted driver would forget the claims")

    # The budget and the slice.
    def poll_budget(self):
        try:
            budget, unresolved = k8s.budget_status(self.cfg.pinctl, self.cfg.socket)
            if unresolved and "cgns" not in self.warned:
                log(k8s.CGNS_WARNING)
                self.warned.add("cgns")
        except RuntimeError as e:
            if self.budget is not None and "daemon" not in self.warned:
                log(f"the daemon does not answer ({e}): the slice keeps the last budget")
            self.warned.add("daemon")
            return False
        self.warned.discard("daemon")
        with self.lock:
            if budget != self.budget:
                log(f"budget {budget} bytes")
            self.budget = budget
        return True

    def slice_devices(self):
        """The devices this node offers for the budget: one shared device with the budget as consumable capacity,
        or (DRA_DEVICES=gib) one device per whole GiB."""
        b = self.budget or 0
        if self.cfg.devices == "gib":
            n = b // GIB
            if n > MAX_DEVICES and "gib-cap" not in self.warned:
                log(f"budget of {n} GiB: a ResourceSlice holds {MAX_DEVICES} devices, so {MAX_DEVICES} are offered")
                self.warned.add("gib-cap")
            return [{"name": f"gib-{i}", "capacity": {CAPACITY: {"value": "1Gi"}}} for i in range(min(n, MAX_DEVICES))]
        value = b // STEP * STEP
        if value < 2 * STEP:
            return []
        default = min(GIB, value)
        return [{"name": "pinned", "allowMultipleAllocations": True,
                 "capacity": {CAPACITY: {"value": str(value),
                                         "requestPolicy": {"default": str(default),
                                                           "validRange": {"min": str(STEP), "step": str(STEP)}}}}}]

    def device_bytes(self, name):
        """What a whole device of this node's pool holds (a result without consumedCapacity)."""
        if re.fullmatch(r"gib-[0-9]+", name):
            return GIB
        if name == "pinned":
            return (self.budget or 0) // STEP * STEP
        return None

    def publish(self):
        """Write the node's ResourceSlice when its devices differ from the last written (or none was yet)."""
        with self.lock:
            if self.budget is None:
                return
            devices = self.slice_devices()
            if devices == self.published:
                return
        path = "/apis/resource.k8s.io/v1/resourceslices"
        try:
            if self.node_uid is None:
                self.node_uid = self.api.call("GET", f"/api/v1/nodes/{self.cfg.node}")["metadata"]["uid"]
            try:
                cur = self.api.call("GET", f"{path}/{self.cfg.slice_name}")
            except ApiError as e:
                if e.code != 404:
                    raise
                cur = None
            gen = int(((cur or {}).get("spec", {}).get("pool") or {}).get("generation") or 0) + 1
            obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                   "metadata": {"name": self.cfg.slice_name,
                                "labels": {"app.kubernetes.io/name": "pinbroker-dra-driver"},
                                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.cfg.node,
                                                     "uid": self.node_uid, "controller": True}]},
                   "spec": {"driver": self.cfg.driver, "nodeName": self.cfg.node,
                            "pool": {"name": self.cfg.node, "generation": gen, "resourceSliceCount": 1},
                            "devices": devices}}
            if cur is None:
                self.api.call("POST", path, obj)
            else:
                obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                self.api.call("PUT", f"{path}/{self.cfg.slice_name}", obj)
        except (ApiError, KeyError, TypeError, ValueError) as e:
            log(f"cannot publish the ResourceSlice {self.cfg.slice_name}: {e} (retried at the next poll)")
            return
        with self.lock:
            self.published = devices
        what = f"{len(devices)} devices of 1 GiB" if self.cfg.devices == "gib" else \
            (f"capacity {devices[0]['capacity'][CAPACITY]['value']} bytes" if devices else "no device (budget too small)")
        log(f"ResourceSlice {self.cfg.slice_name} generation {gen}: {what}")

    # Claims and quotas.
    def read_claim(self, c):
        """(bytes, pod UIDs, devices) of claim c (a dra Claim) as allocated on this node; ValueError saying why not."""
        try:
            obj = self.api.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{c.namespace}/resourceclaims/{c.name}")
        except ApiError as e:
            raise ValueError(f"cannot read ResourceClaim {c.namespace}/{c.name}: {e}") from None
        if obj.get("metadata", {}).get("uid") != c.uid:
            raise ValueError(f"ResourceClaim {c.namespace}/{c.name} has UID {obj.get('metadata', {}).get('uid')}, "
                             f"not {c.uid}: it was replaced")
        alloc = (obj.get("status") or {}).get("allocation")
        if not alloc:
            raise ValueError(f"ResourceClaim {c.namespace}/{c.name} is not allocated")
        total, devices = 0, []
        for r in (alloc.get("devices") or {}).get("results") or []:
            if r.get("driver") != self.cfg.driver or r.get("pool") != self.cfg.node:
                continue
            consumed = (r.get("consumedCapacity") or {}).get(CAPACITY)
            n = quantity(consumed) if consumed is not None else self.device_bytes(r.get("device", ""))
            if n is None:
                raise ValueError(f"ResourceClaim {c.namespace}/{c.name}: device {r.get('device')} is not one of "
                                 f"this driver's on {self.cfg.node}")
            total += n
            devices.append({"request": r.get("request", ""), "pool": r["pool"], "device": r.get("device", "")})
        if not devices:
            raise ValueError(f"ResourceClaim {c.namespace}/{c.name} has no device of {self.cfg.driver} on {self.cfg.node}")
        pods = [ref["uid"] for ref in (obj.get("status") or {}).get("reservedFor") or []
                if ref.get("resource") == "pods" and not ref.get("apiGroup") and ref.get("uid")]
        return total, pods, devices

    def pod_quotas(self):
        """{pod UID: bytes}: the sum of each pod's prepared claims."""
        want = {}
        for cl in self.claims.values():
            for p in cl["pods"]:
                want[p] = want.get(p, 0) + int(cl["bytes"])
        return want

    def reconcile(self, pods=None):
        """Set the quota of every pod with prepared claims whose rule the daemon lacks or has at another size,
        and clear the rules of pods left with none. Returns the pods of pods (default: all) whose quota is set."""
        with self.lock:
            want = self.pod_quotas()
            try:
                rules = k8s.quota_rules(self.cfg.pinctl, self.cfg.socket)
            except RuntimeError as e:
                if want or self.set_paths:
                    log(f"cannot read the daemon's quotas, none set now: {e}")
                return set()
            cgroups = k8s.pod_cgroups(self.cfg.cgroup_root) if want else {}
            done = set()
            for uid, n in sorted(want.items()):
                path = cgroups.get(k8s.cgroup_key(uid))
                if path is None:
                    if pods is None or uid in pods:
                        log(f"pod {uid}: no cgroup named for it under {self.cfg.cgroup_root}: quota not set")
                    continue
                if not k8s.set_pod_quota(self.cfg.pinctl, self.cfg.socket, rules, uid, path, n, f"{n} bytes", log):
                    continue
                self.set_paths[uid] = path
                done.add(uid)
            for uid in [u for u in self.set_paths if u not in want]:
                k8s.clear_pod_quota(self.cfg.pinctl, self.cfg.socket, rules, uid, self.set_paths.pop(uid),
                                    "has no prepared claim left", log)
            return done

    def prepare(self, c):
        """One claim: its NodePrepareResourceResponse."""
        dra = self.dra
        with self.lock:
            known = self.claims.get(c.uid)
        if known is None:
            try:
                total, pods, devices = self.read_claim(c)
            except ValueError as e:
                log(str(e))
                return dra.NodePrepareResourceResponse(error=f"pinbroker: {e}")
            known = {"namespace": c.namespace, "name": c.name, "bytes": total, "pods": pods, "devices": devices}
            with self.lock:
                self.claims[c.uid] = known
                self.save_state()
            log(f"claim {c.namespace}/{c.name} ({c.uid}): {total} bytes for pods {', '.join(pods) or '(none)'}")
        done = self.reconcile(set(known["pods"]))
        missing = [p for p in known["pods"] if p not in done]
        if missing and self.cfg.strict:
            return dra.NodePrepareResourceResponse(
                error=f"pinbroker: the quota of pods {', '.join(missing)} could not be set (DRA_STRICT=1)")
        return dra.NodePrepareResourceResponse(devices=[
            dra.Device(request_names=[d["request"]] if d["request"] else [], pool_name=d["pool"],
                       device_name=d["device"], cdi_device_ids=[CDI_DEVICE])
            for d in known["devices"]])

    def unprepare(self, c):
        with self.lock:
            gone = self.claims.pop(c.uid, None)
            if gone is not None:
                self.save_state()
                log(f"claim {c.namespace}/{c.name} ({c.uid}) unprepared")
        self.reconcile()
        return self.dra.NodeUnprepareResourceResponse()

    def write_cdi_spec(self):
        """The CDI spec of the device every prepared claim carries: the node's socket folder, read-only, and
        PINBROKER_SOCKET."""
        spec = {"cdiVersion": "0.5.0", "kind": CDI_KIND, "devices": [{"name": "socket", "containerEdits": {
            "env": ["PINBROKER_SOCKET=" + os.path.join(self.cfg.sock_dir, os.path.basename(self.cfg.socket))],
            "mounts": [{"hostPath": self.cfg.sock_dir_host, "containerPath": self.cfg.sock_dir,
                        "options": ["ro", "nosuid", "nodev", "bind"]}]}}]}
        path = os.path.join(self.cfg.cdi_dir, CDI_KIND.replace("/", "-") + ".json")
        os.makedirs(self.cfg.cdi_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(spec, f, indent=2)
        os.chmod(path + ".tmp", 0o644)
        os.rename(path + ".tmp", path)
        return path


def make_servicers(drv, reg, reg_grpc):
    dra = drv.dra

    class DRA(drv.dra_grpc.DRAPluginServicer):
        def NodePrepareResources(self, request, context):
            return dra.NodePrepareResourcesResponse(claims={c.uid: drv.prepare(c) for c in request.claims})

        def NodeUnprepareResources(self, request, context):
            return dra.NodeUnprepareResourcesResponse(claims={c.uid: drv.unprepare(c) for c in request.claims})

    class Registration(reg_grpc.RegistrationServicer):
        def GetInfo(self, request, context):
            return reg.PluginInfo(type="DRAPlugin", name=drv.cfg.driver, endpoint=drv.cfg.dra_socket,
                                  supported_versions=[SERVICE])

        def NotifyRegistrationStatus(self, request, context):
            if request.plugin_registered:
                log(f"registered with the kubelet as {drv.cfg.driver} ({SERVICE} at {drv.cfg.dra_socket})")
            else:
                log(f"the kubelet refused the registration: {request.error}")
            return reg.RegistrationStatusResponse()

    return DRA(), Registration()


def main():
    cfg = k8s.read_config(Config, log)
    if cfg is None:
        return 2
    try:
        s = k8s.load_stubs(HERE, ["dra", "pluginregistration"], "DRA_STUBS_DIR")
    except (ImportError, RuntimeError) as e:
        log(f"no gRPC stubs: {e} (apt-get install python3-grpc-tools)")
        return 1
    (dra, dra_grpc), (reg, reg_grpc) = s["dra"], s["pluginregistration"]
    os.makedirs(cfg.plugin_dir, mode=0o750, exist_ok=True)
    drv = Driver(cfg, dra, dra_grpc)
    try:
        log(f"CDI spec {drv.write_cdi_spec()}: device {CDI_DEVICE}")
    except OSError as e:
        log(f"cannot write the CDI spec in {cfg.cdi_dir}: {e.strerror}: claims would not get the socket")
        return 1
    stop = k8s.stop_event()
    dra_svc, reg_svc = make_servicers(drv, reg, reg_grpc)
    # The DRA service first: the kubelet connects to it as soon as registration succeeds.
    dra_server = k8s.grpc_server(cfg.dra_socket, lambda srv: dra_grpc.add_DRAPluginServicer_to_server(dra_svc, srv))
    reg_server = k8s.grpc_server(cfg.reg_socket, lambda srv: reg_grpc.add_RegistrationServicer_to_server(reg_svc, srv))
    log(f"serving {SERVICE} at {cfg.dra_socket}, registration at {cfg.reg_socket}; "
        f"{len(drv.claims)} prepared claims from {cfg.state_file}")

    def one_round():
        if drv.poll_budget():
            drv.publish()
        drv.reconcile()

    k8s.poll_until(stop, cfg.poll_s, one_round, log)
    # The registration socket goes first, so the kubelet stops sending work; it wipes this node's slices
    # itself once no plugin of the driver has come back for a while.
    reg_server.stop(1).wait()
    dra_server.stop(5).wait()
    k8s.unlink_quietly(cfg.reg_socket, cfg.dra_socket)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
