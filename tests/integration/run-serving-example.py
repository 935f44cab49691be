#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""examples/serving_host_pool.py against a real pinbrokerd: 8 ranks of 4M where the group fits (every rank pinned)
and where it does not (another job holds most of the budget: every rank falls back, the reason printed, nothing
left charged). Usage: run-serving-example.py PINBROKERD EXAMPLE, with PINBROKER_LIBRARY the build's library. Exits 77
in a sanitizer build (PINBROKER_SANITIZED): Python cannot load an instrumented libpinbroker, as python_pinbroker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

PINBROKERD, EXAMPLE = sys.argv[1], sys.argv[2]
if os.environ.get("PINBROKER_SANITIZED", "0").lower() in ("1", "on", "true"):
    print("example_serving_host_pool: skipped in the sanitizer build (run it in the plain build)")
    sys.exit(77)
PINCTL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(PINBROKERD))), "client", "pinctl")
fails = 0


def check(ok: bool, what: str) -> None:
    global fails
    print(("ok: " if ok else "FAIL: ") + what)
    fails += not ok


def leased(sock: str) -> int:
    out = subprocess.run([PINCTL, "--socket", sock, "status", "-o", "leased_bytes", "--no-headers"],
                         capture_output=True, text=True).stdout
    return int(out.strip() or -1)


def run(budget: str, hold: str | None) -> None:
    tmp = tempfile.mkdtemp(prefix="serving-example.")
    sock = os.path.join(tmp, "pb.sock")
    log = open(os.path.join(tmp, "daemon.log"), "w")
    d = subprocess.Popen([PINBROKERD, "--socket", sock, "--config", "/dev/null", "--budget", budget, "--prewarm",
                          "0", "--hugetlb", "no", "--lock-memory", "no"], stdout=log, stderr=log)
    holder = None
    try:
        for _ in range(300):
            if subprocess.run([PINCTL, "--socket", sock, "status"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        if hold:  # another job's lease: the group's 32M no longer fit
            holder = subprocess.Popen([PINCTL, "--socket", sock, "acquire", hold, "--hold", "600"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            check(holder.stdout.readline().startswith("lease "), f"another job holds {hold}")
        p = subprocess.run([sys.executable, EXAMPLE, "--socket", sock, "--ranks", "8", "--pool-bytes", "4M"],
                           capture_output=True, text=True, timeout=240)
        out = p.stdout + p.stderr
        check(p.returncode == 0, f"budget {budget}: the example exits 0 ({p.returncode}): {out[-600:]!r}")
        if hold:
            check("all 8 ranks fell back to ordinary memory" in out, f"budget {budget}, {hold} held: all fall back")
            check(len(re.findall(r"rank \d: fallback 4194304 bytes \(BudgetExhausted", out)) == 8,
                  "each rank prints the refusal's reason")
            check(leased(sock) == 4 << 20 if hold == "4M" else True, "nothing of the group stays charged")
        else:
            check("all 8 ranks pinned their pools" in out, f"budget {budget}: all 8 ranks pinned")
            check(len(re.findall(r"rank \d: pinned 4194304 bytes", out)) == 8, "each rank took a 4M share")
            check(leased(sock) == 0, "the shares went back when the ranks exited")
    finally:
        if holder:
            holder.terminate()
            holder.wait()
        d.terminate()
        d.wait()


run("64M", None)
run("34M", "4M")
sys.exit(1 if fails else 0)
