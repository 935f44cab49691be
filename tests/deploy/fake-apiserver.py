#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# A stand-in for the Kubernetes API server, just enough for node-patcher.sh and the DRA driver: HTTPS with the
# given certificate, one Node, bearer-token auth, GET /api/v1/nodes/NAME and JSON-patch (RFC 6902
# add/replace/remove) on /api/v1/nodes/NAME/status; resource.k8s.io/v1 ResourceSlices (GET, POST, PUT with
# resourceVersion conflicts, DELETE, each written one validated as the API server's validation does for the
# fields the driver sets: 422 with the reason otherwise) and ResourceClaims (GET). Every request is appended to
# LOG as one JSON line {method, path, content_type, auth, body}. For the test: POST /_test/drop/RESOURCE removes
# a capacity entry (as a kubelet re-registering its node does), POST /_test/forbid makes PATCH answer 403 as
# RBAC would, POST /_test/claim with a ResourceClaim as its body stores it (and DELETE
# /_test/claim/NAMESPACE/NAME removes it). Writes its port to PORTFILE once listening.
# usage: fake-apiserver.py CERT KEY TOKEN NODE PORTFILE LOG
import itertools
import json
import os
import re
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CERT, KEY, TOKEN, NODE, PORTFILE, LOG = sys.argv[1:7]
state = {
    "node": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "5e0c7a4e-6a55-4b8e-9f0d-000000000001"},
             "status": {"capacity": {"cpu": "2", "memory": "16Gi", "pods": "110"},
                        "allocatable": {"cpu": "2", "memory": "15Gi", "pods": "110"}}},
    "forbid": False,
    "slices": {},
    "claims": {},
}
versions = itertools.count(1000)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = re.compile(r"/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)")
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{DNS_LABEL}(\.{DNS_LABEL})*")
C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
QTY = re.compile(r"([0-9]+(\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE])?")
QTY_MULT = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
            "m": 0.001, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def qty(q, where):
    m = QTY.fullmatch(str(q))
    if not m:
        raise ValueError(f"{where}: {q!r} is not a quantity")
    return float(m.group(1)) * QTY_MULT[m.group(3)]


def validate_slice(o):
    """What the API server refuses in a resource.k8s.io/v1 ResourceSlice, for the fields a node-local driver
    sets (pkg/apis/resource/validation, as documented in the resource.k8s.io/v1 types)."""
    if o.get("apiVersion") != "resource.k8s.io/v1" or o.get("kind") != "ResourceSlice":
        raise ValueError(f"apiVersion/kind {o.get('apiVersion')}/{o.get('kind')}")
    name = o.get("metadata", {}).get("name", "")
    if not DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
        raise ValueError(f"metadata.name {name!r} is not a DNS subdomain")
    spec = o.get("spec") or {}
    drv = spec.get("driver", "")
    if not DNS_SUBDOMAIN.fullmatch(drv) or len(drv) > 63:
        raise ValueError(f"spec.driver {drv!r} is not a DNS subdomain of at most 63 characters")
    if sum(1 for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)) != 1:
        raise ValueError("exactly one of spec.nodeName, nodeSelector, allNodes, perDeviceNodeSelection must be set")
    pool = spec.get("pool") or {}
    if not pool.get("name") or not isinstance(pool.get("generation"), int) or pool["generation"] < 0 \
            or not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        raise ValueError(f"spec.pool {pool}: name, generation >= 0 and resourceSliceCount >= 1 are required")
    devs = spec.get("devices") or []
    if len(devs) > 128:
        raise ValueError(f"spec.devices: {len(devs)} devices, at most 128")
    names = [d.get("name", "") for d in devs]
    if len(set(names)) != len(names) or not all(re.fullmatch(DNS_LABEL, n) and len(n) <= 63 for n in names):
        raise ValueError(f"spec.devices[].name {names}: unique DNS labels required")
    for d in devs:
        where = f"spec.devices[{d.get('name')}]"
        if len(d.get("attributes") or {}) + len(d.get("capacity") or {}) > 32:
            raise ValueError(f"{where}: more than 32 attributes and capacities")
        for key, cap in (d.get("capacity") or {}).items():
            w = f"{where}.capacity[{key}]"
            dom, _, ident = key.rpartition("/")
            if not C_IDENT.fullmatch(ident) or (dom and not DNS_SUBDOMAIN.fullmatch(dom)):
                raise ValueError(f"{w}: not a qualified name")
            value = qty(cap.get("value"), w + ".value")
            pol = cap.get("requestPolicy")
            if pol is None:
                continue
            if d.get("allowMultipleAllocations") is not True:
                raise ValueError(f"{w}.requestPolicy: the device must have allowMultipleAllocations: true")
            if "default" not in pol:
                raise ValueError(f"{w}.requestPolicy.default: required with validRange or validValues")
            default = qty(pol["default"], w + ".requestPolicy.default")
            rng = pol.get("validRange")
            if rng is not None:
                lo = qty(rng.get("min"), w + ".validRange.min")
                step = qty(rng["step"], w + ".validRange.step") if "step" in rng else None
                hi = qty(rng["max"], w + ".validRange.max") if "max" in rng else None
                if not 0 <= lo <= value or default < lo or (hi is not None and not default <= hi <= value):
                    raise ValueError(f"{w}: 0 <= min <= value, min <= default (<= max <= value) violated")
                if default > value:
                    raise ValueError(f"{w}: default {default} over the value {value}")
                if step is not None and (step <= 0 or lo + step > value or default % step or (hi or 0) % step):
                    raise ValueError(f"{w}: step must be above 0, min + step <= value, default and max multiples of step")


def unescape(token):
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc, ops):
    for op in ops:
        parts = [unescape(p) for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[p]  # KeyError: a missing parent, refused as the API server does
        if op["op"] in ("add", "replace"):
            if op["op"] == "replace" and parts[-1] not in parent:
                raise KeyError(parts[-1])
            parent[parts[-1]] = op["value"]
        elif op["op"] == "remove":
            del parent[parts[-1]]
        else:
            raise ValueError("unsupported op " + op["op"])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def status(self, code, reason, message):
        self.reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "message": message, "reason": reason, "code": code})

    def handle_any(self, method):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        with open(LOG, "a") as f:
            f.write(json.dumps({"method": method, "path": self.path,
                                "content_type": self.headers.get("Content-Type"),
                                "auth": self.headers.get("Authorization"), "body": body}) + "\n")
        if self.path.startswith("/_test/drop/"):
            state["node"]["status"]["capacity"].pop(self.path[len("/_test/drop/"):], None)
            return self.reply(200, {})
        if self.path == "/_test/forbid":
            state["forbid"] = True
            return self.reply(200, {})
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            return self.status(401, "Unauthorized", "Unauthorized")
        if self.path == "/_test/claim" and method == "POST":
            c = json.loads(body)
            state["claims"][(c["metadata"]["namespace"], c["metadata"]["name"])] = c
            return self.reply(200, {})
        if self.path.startswith("/_test/claim/") and method == "DELETE":
            state["claims"].pop(tuple(self.path.split("/")[3:5]), None)
            return self.reply(200, {})
        node_path = "/api/v1/nodes/" + NODE
        if method == "GET" and self.path == node_path:
            return self.reply(200, state["node"])
        if method == "PATCH" and self.path == node_path + "/status":
            if state["forbid"]:
                return self.status(403, "Forbidden", 'nodes "%s" is forbidden: User "system:serviceaccount:'
                                   'pinbroker:pinbroker-node-patcher" cannot patch resource "nodes/status"' % NODE)
            if self.headers.get("Content-Type") != "application/json-patch+json":
                return self.status(415, "UnsupportedMediaType", "unsupported content type")
            try:
                apply_patch(state["node"], json.loads(body))
            except (KeyError, ValueError, TypeError) as e:
                return self.status(422, "Invalid", "the patch cannot be applied: %r" % e)
            return self.reply(200, state["node"])
        m = CLAIMS.fullmatch(self.path)
        if method == "GET" and m:
            c = state["claims"].get((m.group(1), m.group(2)))
            if c is None:
                return self.status(404, "NotFound", f'resourceclaims.resource.k8s.io "{m.group(2)}" not found')
            return self.reply(200, c)
        if self.path == SLICES or self.path.startswith(SLICES + "/"):
            return self.slices(method, self.path[len(SLICES) + 1:], body)
        if self.path.startswith("/api/v1/nodes/"):
            return self.status(404, "NotFound", 'nodes "%s" not found' % self.path.split("/")[4])
        return self.status(404, "NotFound", "the server could not find the requested resource")

    def slices(self, method, name, body):
        cur = state["slices"].get(name)
        if method == "GET" and name:
            if cur is None:
                return self.status(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            return self.reply(200, cur)
        if method == "DELETE" and name:
            if state["slices"].pop(name, None) is None:
                return self.status(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            return self.reply(200, {"kind": "Status", "status": "Success"})
        if method not in ("POST", "PUT") or (method == "POST") == bool(name):
            return self.status(405, "MethodNotAllowed", f"{method} {self.path}")
        try:
            o = json.loads(body)
            validate_slice(o)
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            return self.status(422, "Invalid", f"ResourceSlice is invalid: {e}")
        n = o["metadata"]["name"]
        if method == "POST" and n in state["slices"]:
            return self.status(409, "AlreadyExists", f'resourceslices.resource.k8s.io "{n}" already exists')
        if method == "PUT":
            if n != name or cur is None:
                return self.status(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            if o["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                return self.status(409, "Conflict", "the object has been modified; please apply your changes "
                                   "to the latest version and try again")
        o["metadata"]["resourceVersion"] = str(next(versions))
        o["metadata"].setdefault("uid", (cur or {}).get("metadata", {}).get("uid", f"slice-{next(versions)}"))
        state["slices"][n] = o
        return self.reply(201 if method == "POST" else 200, o)

    def do_PUT(self):
        self.handle_any("PUT")

    def do_DELETE(self):
        self.handle_any("DELETE")

    def do_GET(self):
        self.handle_any("GET")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def do_POST(self):
        self.handle_any("POST")


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(CERT, KEY)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
with open(PORTFILE + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(PORTFILE + ".tmp", PORTFILE)
srv.serve_forever()
