#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""pinbroker from Python: borrow pinned memory, view it as numpy/torch, handle refusals and revocations.

Run it from the checkout after building (it finds build*/client/libpinbroker.so.1 by itself), or with the
package installed (pip install ./python):

    PINBROKER_SOCKET=/run/pinbroker/pinbroker.sock python3 examples/python_basic.py

With no daemon it still runs, on ordinary memory, and says why.
"""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import pinbroker  # noqa: E402

MiB = 1 << 20


def main() -> int:
    ok, why = pinbroker.cuda_available()
    print(f"libpinbroker: {pinbroker.library_path()}; CUDA registration: {'yes' if ok else 'no (' + why + ')'}")

    try:
        client = pinbroker.connect()
    except pinbroker.NotConnected as e:
        # No daemon: acquire_or_fallback still hands out (pageable) memory.
        print(f"no broker ({e.strerror}); using ordinary memory")
        lease = pinbroker.acquire_or_fallback(16 * MiB, label="example")
        print(lease, "--", lease.fallback_reason)
        lease.release()
        return 0

    with client:
        revoked = threading.Event()

        @client.on_revoke
        def give_back(lease: pinbroker.Lease, deadline_ms: int) -> None:
            # The library's receiver thread: stop using the lease and give it back before the deadline.
            print(f"lease {lease.id} revoked, {deadline_ms} ms to give it back")
            lease.release()
            revoked.set()

        try:
            lease = client.acquire(64 * MiB, label="example", priority="best-effort", timeout=2.0)
        except pinbroker.TooLarge as e:
            print(f"never satisfiable here: {e.strerror}")
            return 1
        except (pinbroker.BudgetExhausted, pinbroker.QuotaExceeded, pinbroker.MemoryPressure,
                pinbroker.Timeout) as e:
            print(f"refused for now ({type(e).__name__}, errno {e.errno}): {e.strerror}")
            lease = client.acquire_or_fallback(64 * MiB, label="example")

        with lease:
            print(lease)
            try:
                import numpy as np

                img = lease.numpy(np.uint8, (64, 3, 224, 224))  # a view: no copy
                img[:] = 7
                print(f"numpy view {img.shape}, sum {int(img[0].sum())}")
                del img
            except ImportError:
                lease.memoryview()[:4] = b"\x07\x07\x07\x07"
            try:
                import torch

                t = lease.tensor(torch.float32, (16, MiB // 4))
                print(f"torch view {tuple(t.shape)}, is_pinned() = {t.is_pinned()}")
                del t
            except ImportError:
                pass
            mine = [r for r in client.leases() if r["id"] == lease.id]
            print("as the daemon sees it:", mine[0] if mine else "(fallback memory: not the daemon's)")
        st = client.status()
        print(f"daemon: {st['leased_bytes'] // MiB} MiB of {st['budget_bytes'] // MiB} MiB leased, "
              f"pressure {st['pressure_state']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
