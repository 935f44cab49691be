#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# A stand-in for the Kubernetes API server, just enough for node-patcher.sh: HTTPS with the given
# certificate, one Node, bearer-token auth, GET /api/v1/nodes/NAME and JSON-patch (RFC 6902
# add/replace/remove) on /api/v1/nodes/NAME/status. Every request is appended to LOG as one JSON
# line {method, path, content_type, auth, body}. For the test: POST /_test/drop/RESOURCE removes a
# capacity entry (as a kubelet re-registering its node does), POST /_test/forbid makes PATCH
# answer 403 as RBAC would. Writes its port to PORTFILE once listening.
# usage: fake-apiserver.py CERT KEY TOKEN NODE PORTFILE LOG
import json
import os
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CERT, KEY, TOKEN, NODE, PORTFILE, LOG = sys.argv[1:7]
state = {
    "node": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
             "status": {"capacity": {"cpu": "2", "memory": "16Gi", "pods": "110"},
                        "allocatable": {"cpu": "2", "memory": "15Gi", "pods": "110"}}},
    "forbid": False,
}


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
        if self.path.startswith("/api/v1/nodes/"):
            return self.status(404, "NotFound", 'nodes "%s" not found' % self.path.split("/")[4])
        return self.status(404, "NotFound", "the server could not find the requested resource")

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
