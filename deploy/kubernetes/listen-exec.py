#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# The DaemonSet's `metrics` container: opens the TCP listening socket that systemd's pinbroker-metrics.socket
# opens on a host, passes it as fd 3 the way systemd does ($LISTEN_FDS=1, $LISTEN_PID = this pid, kept across
# exec) and becomes PROGRAM, pinbroker-metrics-http, which then serves GET /metrics on it (its server mode:
# bounded connections, deadlines, one daemon request a second however many scrapes).
# usage: listen-exec.py [--address ADDR] [--port N] -- PROGRAM [ARG...]     (default :: dual-stack, 9464)
import argparse
import os
import socket
import sys


def main(argv):
    ap = argparse.ArgumentParser(prog="listen-exec.py", description="listen on a TCP port, then exec PROGRAM "
                                 "with the socket as systemd passes one (fd 3, LISTEN_FDS, LISTEN_PID)")
    ap.add_argument("--address", default="::", help="address to listen on (default :: with IPv4 too)")
    ap.add_argument("--port", type=int, default=9464, help="TCP port (default 9464)")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM [ARG...]")
    a = ap.parse_args(argv[1:])
    prog = a.program[1:] if a.program[:1] == ["--"] else a.program
    if not prog or not 0 < a.port < 65536:
        ap.print_usage(sys.stderr)
        print("listen-exec.py: give a port from 1 to 65535 and a program after --", file=sys.stderr)
        return 2
    try:
        family = socket.AF_INET6 if ":" in a.address else socket.AF_INET
        s = socket.create_server((a.address, a.port), family=family, backlog=128,
                                 dualstack_ipv6=family == socket.AF_INET6 and a.address == "::" and socket.has_dualstack_ipv6())
    except OSError as e:
        print(f"listen-exec.py: cannot listen on [{a.address}]:{a.port}: {e.strerror}", file=sys.stderr)
        return 1
    if s.fileno() != 3:
        os.dup2(s.fileno(), 3)  # dup2's copy is inheritable
        s.close()
    else:
        os.set_inheritable(3, True)
    env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
    env.pop("LISTEN_FDNAMES", None)
    try:
        os.execve(prog[0], prog, env)
    except OSError as e:
        print(f"listen-exec.py: cannot run {prog[0]}: {e.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
