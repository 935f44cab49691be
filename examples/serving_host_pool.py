#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A serving stack's per-rank host pool (KV cache offload, say), sized for the whole group and reserved at once.

One process per GPU ("rank"), as LLM servers run them. Each rank sizes its pool from what the broker allows the
group (not from /proc/meminfo as if it were alone), the ranks reserve the group's pools all or nothing, and each
takes its own share as a pinned lease. When the broker refuses, every rank falls back to ordinary memory and says
why: never some ranks pinned and others not.

    python3 examples/serving_host_pool.py --ranks 8                  # size from the broker's budget
    python3 examples/serving_host_pool.py --ranks 8 --pool-bytes 4G  # ask for 4 GiB a rank

Run it from the checkout after building (it finds build*/client/libpinbroker.so.1 by itself), or with the package
installed. PINBROKER_SOCKET or --socket names the daemon.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import pinbroker  # noqa: E402

MiB = 1 << 20


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().rstrip("IB")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    return int(float(num) * units[unit])


def size_per_rank(client: pinbroker.Client, ranks: int, fraction: float, asked: Optional[int]) -> int:
    """The per-rank pool: what was asked, else a share of what this process may still get now, split over the ranks."""
    if asked:
        return asked
    # One snapshot of every bound this process meets (the budget, its uid's and job's quotas, the pressure state),
    # not /proc/meminfo: what an acquire of that size would be granted now.
    room = client.headroom()
    free, page = room.available, room.page_bytes or 4096
    return int(free * fraction) // ranks // page * page


def rank_main(rank: int, ranks: int, path: Optional[str], name: str, share: int, ok: "mp.Array",
              barrier: "mp.Barrier", out: "mp.Queue") -> None:
    reason = ""
    client = reservation = None
    try:
        client = pinbroker.connect(path)
        reservation = client.reserve(name, ranks, share)  # every rank asks; the first reserves, the rest join
        ok[rank] = 1
    except pinbroker.BrokerError as e:  # refused whole (budget, quota, pressure), or no daemon
        reason = f"{type(e).__name__}: {e}"
    barrier.wait()
    # The group decides together: all pinned, or all on ordinary memory.
    if all(ok[:]):
        lease = reservation.acquire(cuda=False)  # this rank's share; cuda=True on a GPU host
        view = lease.memoryview()
        view[:: 1 << 20] = b"\1" * len(range(0, lease.nbytes, 1 << 20))  # the pool in use
        view.release()
        out.put((rank, "pinned", lease.nbytes, ""))
        barrier.wait()  # every rank took its share before anyone lets go
        lease.release()
    else:
        if reservation is not None:
            reservation.release()  # another rank was refused: give the group's bytes back
        if not reason:
            reason = "another rank of the group was refused"
        pool = bytearray(share)  # ordinary (pageable) memory: slower copies, but the server runs
        out.put((rank, "fallback", len(pool), reason))
        barrier.wait()
    if client is not None:
        client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--pool-bytes", type=parse_size, default=None, help="per rank (e.g. 4G); default: from the budget")
    ap.add_argument("--fraction", type=float, default=0.5, help="of the budget's free bytes the group takes")
    ap.add_argument("--name", default=f"host-pool-{os.getpid()}", help="what the ranks agree on")
    ap.add_argument("--socket", default=None)
    args = ap.parse_args()

    try:
        with pinbroker.connect(args.socket) as c:
            share = size_per_rank(c, args.ranks, args.fraction, args.pool_bytes)
    except pinbroker.NotConnected as e:
        share = args.pool_bytes or 64 * MiB
        print(f"no broker ({e.strerror}): sizing {share} bytes a rank")
    if share <= 0:
        print("the budget has nothing free for the group: every rank falls back")
        share = args.pool_bytes or MiB
    print(f"{args.ranks} ranks, {share} bytes a rank ({args.ranks * share} for the group), reserved as {args.name!r}")

    ctx = mp.get_context("fork")
    ok, barrier, out = ctx.Array("i", args.ranks), ctx.Barrier(args.ranks), ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args.ranks, args.socket, args.name, share, ok, barrier, out))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    for rank, kind, nbytes, reason in results:
        print(f"rank {rank}: {kind} {nbytes} bytes" + (f" ({reason})" if reason else ""))
    kinds = {k for _, k, _, _ in results}
    if kinds == {"pinned"}:
        print(f"all {args.ranks} ranks pinned their pools")
    else:
        print(f"all {args.ranks} ranks fell back to ordinary memory")
    return 0 if len(kinds) == 1 and all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
