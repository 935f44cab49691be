# SPDX-License-Identifier: MIT
"""An unmodified-looking torch program for ``pinctl run`` on a GPU host (tests/gpu/run-torch.sh).

It pins tensors the ordinary way (``torch.empty(..., pin_memory=True)``, ``Tensor.pin_memory()``, a
DataLoader with ``pin_memory=True``), copies them to the GPU and back, and then asks the daemon, through the
pinbroker package, which leases its own pid holds. ``--expect exact``: pinctl run installed pinbroker's host
allocator (PINBROKER_TORCH=1 via sitecustomize), so each tensor is one lease of its page-rounded size.
``--expect pow2``: ``pinctl run --no-torch``, torch's own caching allocator under the interposer, so its
power-of-two blocks are leases. Prints one JSON line; exits 0 when the expectation holds, 1 otherwise,
77 without CUDA.
"""

import argparse
import json
import os
import sys

import torch

PAGE = os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect", choices=["exact", "pow2", "fallback", "unbrokered"], required=True)
    ap.add_argument("--label", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA", file=sys.stderr)
        return 77
    import pinbroker

    n = 129_500_000
    a = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    a.fill_(7)
    b = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    ds = torch.utils.data.TensorDataset(torch.arange(4096, dtype=torch.float32).view(64, 64))
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2, pin_memory=True)))[0]
    ok = a.is_pinned() and b.is_pinned() and batch.is_pinned()
    d = a.cuda(non_blocking=True)
    e = b.cuda(non_blocking=True)
    g = batch.cuda(non_blocking=True)
    torch.cuda.synchronize()
    ok = ok and int(d[n - 1].item()) == 7 and torch.equal(e.cpu(), b)
    # The DataLoader's pinned batch: the first 16 rows, on the GPU as in host memory.
    ok = ok and torch.equal(batch, ds.tensors[0][:16]) and torch.equal(g.cpu(), batch)

    with pinbroker.connect() as c:
        mine = [r for r in c.leases() if r["pid"] == os.getpid()]
        unbrokered = c.status().get("unbrokered_bytes", 0)
    sizes = sorted(r["bytes"] for r in mine)
    labels = sorted({r["label"] for r in mine})
    rounded = (n + PAGE - 1) // PAGE * PAGE
    batch_rounded = (batch.numel() * batch.element_size() + PAGE - 1) // PAGE * PAGE
    try:
        import pinbroker.torch_alloc as ta0

        st0 = ta0.allocator_stats() or {}
    except Exception:
        st0 = {}
    if args.expect == "exact":
        # Each tensor, and the pin thread's copy of the batch, is one lease of its page-rounded size.
        want = rounded in sizes and (4 << 20) in sizes and batch_rounded in sizes
    elif args.expect == "pow2":
        want = (128 << 20) in sizes and rounded not in sizes
    elif args.expect == "fallback":
        # A budget too small for the big tensor: the allocator fell back to torch's own, counted, and it is pinned.
        want = rounded not in sizes and st0.get("fallbacks", 0) > 0
    else:
        # --no-torch, budget too small: the interposer's fallback=cuda pinned it through the driver and reported it.
        want = rounded not in sizes and unbrokered >= (128 << 20)
    try:
        import pinbroker.torch_alloc as ta

        stats = ta.allocator_stats()
    except Exception:  # the package without the allocator module
        stats = None
    print(json.dumps({"expect": args.expect, "pinned": ok, "lease_bytes": sizes, "labels": labels,
                      "unbrokered_bytes": unbrokered,
                      "ld_preload": os.environ.get("LD_PRELOAD", ""), "allocator": bool(stats),
                      "allocator_stats": stats}, default=str))
    labels_ok = all(lb == args.label for lb in labels if not lb.startswith("torch:"))
    if args.expect in ("exact", "pow2"):
        labels_ok = labels_ok and bool(labels)
    return 0 if ok and want and labels_ok else 1


if __name__ == "__main__":
    sys.exit(main())
