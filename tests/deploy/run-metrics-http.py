#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""pinbroker-metrics-http with real requests on a socketpair (inetd-style: the connection as stdin and stdout),
against a running daemon; the endpoint as the units run it, under a flood of idle connections; and
systemd-analyze verify of the socket and service units where systemd-analyze is installed.

usage: run-metrics-http.py SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail
Checks: GET /metrics answers 200 with Content-Type text/plain; version=0.0.4 and the daemon's metrics (which
`promtool check metrics` accepts, where promtool is installed), HEAD the same headers and no body, a query string
is ignored; GET / and other paths 404; POST 405; garbage, HTTP/0.9 and HTTP/2 request lines 400; a head over
8 KiB 431; a client that sends half a request, or nothing, gets 408 after --timeout-ms and the server exits; a
client that connects and closes gets nothing; with the daemon stopped, 503. The server always exits 0 or 1,
never by a signal. With --daemon-marker and no marker: 503 and not one connection to the broker's socket (a
scrape never starts a stopped daemon through pinbrokerd.socket), and the units agree on the marker.

Flood (issue 38 finding 9): the endpoint started as systemd/pinbroker-metrics.socket says (Accept=no: the server
given the listening socket through $LISTEN_FDS, as systemd passes it; Accept=yes: one server per connection, and
at most MaxConnections= at once, the rest closed at once, as systemd does), then 16 one-byte connections, each
re-opened as soon as it is cut, and again 200 of them (more than the server holds at once); meanwhile 20 scrapes,
each with a 2 s timeout, of which at least 95% must succeed (200 and the daemon's metrics). The rate is printed.
Then the same under connections that send whole requests and never read the answers, beside junk senders (40
scrapes), and under 8 threads of whole requests closed unread.
"""
import os
import random
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

SRC, BUILD = sys.argv[1], sys.argv[2]
PINBROKERD = os.path.join(BUILD, "daemon", "pinbrokerd")
PINCTL = os.path.join(BUILD, "client", "pinctl")
HTTP = os.path.join(BUILD, "client", "pinbroker-metrics-http")
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, file=sys.stdout if cond else sys.stderr)
    if not cond:
        failures.append(what)


def request(sock_path, data, timeout_ms=2000, close_after_send=False, linger_s=0.0, args=()):
    """Run the server on one end of a socketpair, send data from the other; return (rc, raw answer, seconds)."""
    ours, theirs = socket.socketpair()
    t0 = time.monotonic()
    p = subprocess.Popen([HTTP, "--socket", sock_path, "--timeout-ms", str(timeout_ms), *args], stdin=theirs,
                         stdout=theirs)
    theirs.close()
    try:
        if data:
            ours.sendall(data)
        if close_after_send:
            ours.shutdown(socket.SHUT_WR)
        if linger_s:
            time.sleep(linger_s)
        ours.settimeout(30)
        chunks = []
        while True:
            b = ours.recv(65536)
            if not b:
                break
            chunks.append(b)
        # Closed before waiting: the server drains what is left until EOF (its lingering close).
        ours.close()
        rc = p.wait(timeout=30)
    finally:
        ours.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc, b"".join(chunks), time.monotonic() - t0


def parse(raw):
    """(status, {header: value}, body) of one HTTP/1.1 answer, or (None, {}, raw) when it is none."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.1 (\d{3}) ", lines[0]) if sep else None
    if not m:
        return None, {}, raw
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(m.group(1)), headers, body


def expect(sock_path, name, data, status, **kw):
    rc, raw, secs = request(sock_path, data, **kw)
    code, headers, body = parse(raw)
    check(rc in (0, 1), f"{name}: the server exits 0 or 1 (got {rc})")
    check(code == status, f"{name}: status {status} (got {code}: {raw[:120]!r})")
    if code is not None:
        check(headers.get("content-length") == str(len(body)) or data.startswith(b"HEAD"),
              f"{name}: Content-Length matches the body")
    return headers, body, secs


def unit_settings():
    """The [Socket] settings of systemd/pinbroker-metrics.socket that shape how connections are served."""
    settings = {}
    with open(os.path.join(SRC, "systemd", "pinbroker-metrics.socket")) as f:
        for line in f:
            k, sep, v = line.strip().partition("=")
            if sep and not k.startswith("#"):
                settings[k] = v
    return settings


class AcceptPerConnection:
    """Accept=yes as systemd serves it: one server per connection, its stdin and stdout; past MaxConnections=
    (systemd's default 64) a connection is closed at once (socket.c: "Too many incoming connections")."""

    def __init__(self, lsock, argv, env, most):
        self.lsock, self.argv, self.env, self.most = lsock, argv, env, most
        self.procs = []
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        self.lsock.settimeout(0.1)
        while not self.stop:
            self.procs = [p for p in self.procs if p.poll() is None]
            try:
                conn, _ = self.lsock.accept()
            except socket.timeout:
                continue
            if len(self.procs) >= self.most:
                conn.close()
                continue
            self.procs.append(subprocess.Popen(self.argv, stdin=conn, stdout=conn, env=self.env))
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join()
        for p in self.procs:
            p.kill()
            p.wait()


class ListenFdServer:
    """Accept=no as systemd serves it: one server given the listening sockets as fd 3 on, $LISTEN_FDS how many
    and $LISTEN_PID its own pid (sd_listen_fds(3))."""

    def __init__(self, lsocks, argv, env):
        fds = [ls.fileno() for ls in lsocks]
        pass_on = ("import fcntl, os, sys; fds = [int(f) for f in sys.argv[1].split(',')]; "
                   "moved = [fcntl.fcntl(f, fcntl.F_DUPFD, 100) for f in fds]; [os.close(f) for f in fds]; "
                   "[os.dup2(f, 3 + i) for i, f in enumerate(moved)]; [os.close(f) for f in moved]; "
                   "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(fds))); "
                   "os.execv(sys.argv[2], sys.argv[2:])")
        self.p = subprocess.Popen([sys.executable, "-c", pass_on, ",".join(map(str, fds)), *argv], env=env,
                                  pass_fds=fds, stdin=subprocess.DEVNULL)

    def close(self):
        self.p.kill()
        self.p.wait()


def listener(settings):
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(int(settings.get("Backlog", "4096")))
    return lsock


def start_endpoint(sock):
    """The endpoint on loopback ports as the socket unit says to serve it: (listening sockets, server, how).
    With Accept=no the server gets two, as from two ListenStream= lines (loopback and a management address)."""
    settings = unit_settings()
    env = dict(os.environ, PINBROKER_SOCKET=sock)
    if settings.get("Accept", "no").lower() in ("yes", "true", "1", "on"):
        most = int(settings.get("MaxConnections", "64"))
        lsocks = [listener(settings)]
        server = AcceptPerConnection(lsocks[0], [HTTP], env, most)
        how = f"Accept=yes, MaxConnections={most}"
    else:
        lsocks = [listener(settings), listener(settings)]
        server = ListenFdServer(lsocks, [HTTP], env)
        how = "Accept=no"
    return lsocks, server, how


def connect_nonblocking(port):
    """A non-blocking socket connecting to port on 127.0.0.1 (the connect under way), or None where connect failed."""
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        return None
    return s


def flood(port, n, stop):
    """n connections to port that send one byte and wait; each re-opened as soon as the server cuts it."""
    sel = selectors.DefaultSelector()

    def open_one():
        s = connect_nonblocking(port)
        if s is not None:
            sel.register(s, selectors.EVENT_WRITE)

    for _ in range(n):
        open_one()
    while not stop.is_set():
        for key, ev in sel.select(timeout=0.1):
            s = key.fileobj
            if ev & selectors.EVENT_WRITE:
                try:
                    s.send(b"G")
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                except OSError:
                    pass
            else:
                try:
                    if s.recv(4096):
                        continue  # an answer (408): the cut comes next
                except BlockingIOError:
                    continue
                except OSError:
                    pass
            sel.unregister(s)
            s.close()
            open_one()
    for key in list(sel.get_map().values()):
        key.fileobj.close()


def request_flood(port, stop):
    """Whole GET /metrics requests to port as fast as one thread makes them, each connection closed unread."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        except OSError:
            pass


def unread_flood(port, stop):
    """Whole requests whose answers are never read (a 1 KiB receive buffer), 200 held open at a time."""
    held = []
    while not stop.is_set():
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            held.append(s)
        except OSError:
            pass
        if len(held) > 200:
            held.pop(0).close()
    for s in held:
        s.close()


def junk_flood(port, stop):
    """100 connections at a time, each sent 64 KiB of junk every 10 ms (answered 431, then drained)."""
    held = []
    while not stop.is_set():
        s = connect_nonblocking(port)
        if s is None:
            continue
        held.append(s)
        for h in held:
            try:
                h.send(b"x" * 65536)
            except OSError:
                pass
        if len(held) > 100:
            held.pop(0).close()
        stop.wait(0.01)
    for s in held:
        s.close()


def scrape(port, timeout_s=2.0):
    """One scrape as Prometheus makes it: True for 200 with the daemon's metrics within timeout_s."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nUser-Agent: Prometheus/2.42.0\r\n\r\n")
            chunks = []
            while time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
    except OSError:
        return False
    code, _, body = parse(b"".join(chunks))
    return code == 200 and re.search(rb"^pinbroker_budget_bytes ", body, re.M) is not None


def scrapes_under(port, floods, head_start_s, n, every_s):
    """How many of n scrapes, one every every_s seconds, succeed while each of floods(stop) runs on a thread of its
    own (from head_start_s before the first) until stop is set."""
    stop = threading.Event()
    ts = [threading.Thread(target=f, args=(stop,), daemon=True) for f in floods]
    for t in ts:
        t.start()
    time.sleep(head_start_s)
    ok = 0
    for _ in range(n):
        ok += scrape(port)
        time.sleep(every_s)
    stop.set()
    for t in ts:
        t.join()
    return ok


def check_flood(sock):
    lsocks, server, how = start_endpoint(sock)
    port = lsocks[0].getsockname()[1]
    try:
        for _ in range(50):  # the server is up once a scrape answers
            if scrape(port, 0.5):
                break
            time.sleep(0.1)
        else:
            check(False, f"the endpoint ({how}) answers a scrape before the flood")
            return
        for n in (16, 200):
            # The flood holds its connections before the first scrape.
            ok = scrapes_under(port, [lambda stop, n=n: flood(port, n, stop)], 1.0, 20, 0.5)
            print(f"flood of {n} one-byte connections ({how}): {ok} of 20 scrapes succeeded")
            check(ok >= 19, f"flood of {n} idle connections ({how}): at least 95% of scrapes succeed ({ok} of 20)")
        # Connections that never read their answers (held for the answer's deadline) beside junk senders: when the
        # table was full of them, a newcomer closed the one connection still reading its request, often the
        # scraper's, just accepted, before its request was read (14 to 18 of 20 scrapes got through).
        ok = scrapes_under(port, [lambda stop, f=f: f(port, stop) for f in (unread_flood, junk_flood)], 1.5, 40, 0.25)
        print(f"unread answers and junk ({how}): {ok} of 40 scrapes succeeded")
        check(ok >= 38, f"unread answers and junk ({how}): at least 95% of scrapes succeed ({ok} of 40)")
        # Whole requests, as fast as 8 threads send them: each used to cost a round trip to the daemon, so the
        # backlog grew and 2 to 5 of 20 scrapes got through; one answer of the daemon serves a second of them.
        ok = scrapes_under(port, [lambda stop: request_flood(port, stop)] * 8, 1.0, 20, 0.5)
        print(f"flood of whole requests from 8 threads ({how}): {ok} of 20 scrapes succeeded")
        check(ok >= 19, f"flood of whole requests ({how}): at least 95% of scrapes succeed ({ok} of 20)")
        for ls in lsocks[1:]:
            check(scrape(ls.getsockname()[1]), f"a scrape on the second listening socket ({how}) succeeds")
    finally:
        server.close()
        for ls in lsocks:
            ls.close()


def unit_lines(name, key):
    """The values of key= in systemd/NAME, in order."""
    with open(os.path.join(SRC, "systemd", name)) as f:
        return [line.strip().partition("=")[2] for line in f if line.strip().startswith(key + "=")]


def check_daemon_marker(tmp, sock):
    """A scrape never starts a stopped daemon: pinbrokerd.socket is PID 1's, so a connection to it would start
    pinbrokerd.service again. With --daemon-marker the server asks the daemon only while the marker exists: absent,
    503 and not one connection to the broker's socket (a listening socket stands in for pinbrokerd.socket and
    counts them); present, the daemon's metrics. The units agree on the marker: pinbrokerd.service makes it once
    ready (ExecStartPost=) and removes it before a stop (ExecStop=) and after any end (ExecStopPost=), and
    pinbroker-metrics.service passes it."""
    marker = os.path.join(tmp, "pinbrokerd.running")
    stand_in = os.path.join(tmp, "socket-unit.sock")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lsock.bind(stand_in)
    lsock.listen(16)
    lsock.setblocking(False)
    try:
        headers, body, _ = expect(stand_in, "GET /metrics, the daemon's marker absent",
                                  b"GET /metrics HTTP/1.1\r\n\r\n", 503, args=("--daemon-marker", marker))
        check(b"pinbrokerd is not running" in body and marker.encode() in body,
              f"marker absent: the body says the daemon is not running and names the marker ({body[:160]!r})")
        try:
            conn, _ = lsock.accept()
            conn.close()
            connected = True
        except BlockingIOError:
            connected = False
        check(not connected, "marker absent: no connection to the broker's socket (which would start the daemon)")
    finally:
        lsock.close()
    open(marker, "w").close()
    _, body, _ = expect(sock, "GET /metrics, the daemon's marker there", b"GET /metrics HTTP/1.1\r\n\r\n", 200,
                        args=("--daemon-marker", marker))
    check(b"pinbroker_budget_bytes" in body, "marker there: the daemon's metrics")
    os.unlink(marker)

    svc = "pinbroker-metrics.service"
    m = re.search(r"--daemon-marker (\S+)", " ".join(unit_lines(svc, "ExecStart")))
    check(m is not None, f"{svc}: ExecStart passes --daemon-marker")
    if m:
        unit_marker = m.group(1)
        for key, cmd in (("ExecStartPost", "touch"), ("ExecStop", "rm -f"), ("ExecStopPost", "rm -f")):
            check(any(v.lstrip("-+!@:").split()[0].endswith("/" + cmd.split()[0]) and v.endswith(" " + unit_marker)
                      for v in unit_lines("pinbrokerd.service", key)),
                  f"pinbrokerd.service: {key}= {cmd} {unit_marker}")
        check(os.path.dirname(unit_marker) == os.path.dirname(unit_lines("pinbrokerd.socket", "ListenSequentialPacket")[0]),
              "the marker is in the broker socket's folder (made at boot by the tmpfiles snippet)")


def main():
    for f in (PINBROKERD, PINCTL, HTTP):
        if not os.access(f, os.X_OK):
            print(f"FAIL: no {f}: build first", file=sys.stderr)
            return 1
    tmp = tempfile.mkdtemp(prefix="pinbroker-metrics-http.")
    os.chmod(tmp, 0o755)
    sock = os.path.join(tmp, "pinbroker.sock")
    log = open(os.path.join(tmp, "daemon.log"), "w")
    d = subprocess.Popen([PINBROKERD, "--socket", sock, "--budget", "64M", "--prewarm", "4M"], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log)
    try:
        for _ in range(150):
            if subprocess.run([PINCTL, "--socket", sock, "status"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            print("FAIL: pinbrokerd did not answer", file=sys.stderr)
            return 1

        headers, body, _ = expect(sock, "GET /metrics", b"GET /metrics HTTP/1.1\r\nHost: localhost:9464\r\n"
                                  b"Accept: text/plain;version=0.0.4\r\nUser-Agent: Prometheus/2.42.0\r\n\r\n", 200)
        check(headers.get("content-type") == "text/plain; version=0.0.4; charset=utf-8",
              f"GET /metrics: Content-Type text/plain; version=0.0.4 (got {headers.get('content-type')})")
        check(re.search(rb"^pinbroker_budget_bytes 67108864$", body, re.M) is not None,
              "GET /metrics: the daemon's pinbroker_budget_bytes in the body")
        if shutil.which("promtool"):
            r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
            check(r.returncode == 0, "GET /metrics: promtool check metrics accepts the body " +
                  (r.stdout + r.stderr).decode(errors="replace"))
        else:
            print("note: promtool not found (Debian package prometheus): the body is not linted")
        headers, body, _ = expect(sock, "HEAD /metrics", b"HEAD /metrics HTTP/1.0\n\n", 200)
        check(body == b"" and int(headers.get("content-length", "0")) > 0, "HEAD /metrics: headers, no body")
        expect(sock, "GET /metrics?name[]=x", b"GET /metrics?name[]=x HTTP/1.1\r\n\r\n", 200)
        expect(sock, "GET / (request line only, then EOF)", b"GET / HTTP/1.1\r\n", 404, close_after_send=True)
        for path in (b"/", b"/metricsx", b"/metrics/", b"/" + b"a" * 4000):
            expect(sock, f"GET {path[:20].decode()}", b"GET " + path + b" HTTP/1.1\r\n\r\n", 404)
        headers, _, _ = expect(sock, "POST /metrics", b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405)
        check(headers.get("allow") == "GET, HEAD", "POST /metrics: Allow: GET, HEAD")
        rnd = random.Random(28)
        garbage = [b"garbage\r\n\r\n", b"GET /metrics\r\n\r\n", b"GET /metrics HTTP/2.0\r\n\r\n",
                   b"get /metrics HTTP/1.1\r\n\r\n", b"GET metrics HTTP/1.1\r\n\r\n", b"GET  /metrics HTTP/1.1\r\n\r\n",
                   b"GET /met\x00rics HTTP/1.1\r\n\r\n", b"GET /metrics HTTP/1.1 extra\r\n\r\n", b"\r\n\r\n",
                   b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n\n"]
        garbage += [bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 3000))) + b"\n\n" for _ in range(20)]
        for i, g in enumerate(garbage):
            expect(sock, f"garbage {i} ({g[:16]!r})", g, 400)
        expect(sock, "a request head over 8 KiB", b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431)
        # The bound is --max-head-bytes: raised, the same head is answered; lowered, a 2 KiB one is not.
        expect(sock, "a 20 KB head under --max-head-bytes 65536",
               b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 200, args=("--max-head-bytes", "65536"))
        expect(sock, "a 2 KiB head over --max-head-bytes 1024",
               b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 2048 + b"\r\n\r\n", 431, args=("--max-head-bytes", "1024"))
        for bad in ("1023", "1048577", "8k", ""):
            r = subprocess.run([HTTP, "--max-head-bytes", bad], stdin=subprocess.DEVNULL, capture_output=True)
            check(r.returncode == 2 and b"--max-head-bytes wants 1024 to 1048576" in r.stderr,
                  f"--max-head-bytes {bad!r}: refused with exit 2 and the bounds ({r.returncode}, {r.stderr[:80]!r})")
        _, _, secs = expect(sock, "half a request, then silence", b"GET /metrics HTTP/1.1\r\nHost: x\r\n", 408,
                            timeout_ms=500, linger_s=0)
        check(0.4 <= secs < 10, f"half a request: answered after the 500 ms timeout ({secs:.2f} s)")
        _, _, secs = expect(sock, "nothing at all", b"", 408, timeout_ms=300)
        check(0.2 <= secs < 10, f"nothing at all: answered after the 300 ms timeout ({secs:.2f} s)")
        rc, raw, _ = request(sock, b"", close_after_send=True)
        check(rc == 0 and raw == b"", f"connect and close: no answer, exit 0 (rc {rc}, {raw[:40]!r})")
        check_daemon_marker(tmp, sock)
        check_flood(sock)
    finally:
        d.terminate()
        d.wait()
        log.close()
    headers, body, _ = expect(sock, "GET /metrics without a daemon", b"GET /metrics HTTP/1.1\r\n\r\n", 503)
    check(b"no metrics from the daemon" in body, "GET /metrics without a daemon: the body says why")

    # The units, as installed: ExecStart pointed at this build's server.
    sa = shutil.which("systemd-analyze")
    if sa:
        units = os.path.join(tmp, "units")
        os.mkdir(units)
        for u in ("pinbroker-metrics.socket", "pinbroker-metrics.service"):
            with open(os.path.join(SRC, "systemd", u)) as f:
                text = f.read().replace("/usr/libexec/pinbroker-metrics-http", HTTP)
            with open(os.path.join(units, u), "w") as f:
                f.write(text)
        r = subprocess.run([sa, "verify", "--man=no", os.path.join(units, "pinbroker-metrics.socket"),
                            os.path.join(units, "pinbroker-metrics.service")], capture_output=True, text=True)
        check(r.returncode == 0, "systemd-analyze verify of the socket and service " + r.stdout + r.stderr)
        r = subprocess.run([sa, "security", "--offline=true", os.path.join(units, "pinbroker-metrics.service")],
                           capture_output=True, text=True)
        m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
        check(m is not None and float(m.group(1)) <= 2.0,
              "systemd-analyze security: the service's exposure at most 2.0 (got %s)" % (m.group(1) if m else r.stderr))
    else:
        print("note: systemd-analyze not found (Debian package systemd): the units are not verified")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
