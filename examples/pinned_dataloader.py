#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A training-style loop on pinbroker.torch.DataLoader: batches arrive pinned, copies to the GPU overlap compute.

    PYTHONPATH=python python3 examples/pinned_dataloader.py            # pinbrokerd on $PINBROKER_SOCKET
    PYTHONPATH=python python3 examples/pinned_dataloader.py --workers 0

Without a daemon (or on a CPU-only host) it runs the same, as torch.utils.data.DataLoader(pin_memory=True) would,
after one warning.
"""

import argparse
import time

import torch

from pinbroker.torch import DataLoader, record_stream


class Synthetic(torch.utils.data.Dataset):
    """uint8 images with an index label and a little metadata, as a decoding dataset would return them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.image = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"image": self.image, "label": i % 1000, "meta": {"index": i, "path": f"img/{i:06d}.jpg"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=200)
    args = ap.parse_args()

    loader = DataLoader(Synthetic(args.batch * args.batches), batch_size=args.batch, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    copy_stream = torch.cuda.Stream() if cuda else None
    t0 = time.perf_counter()
    seen = 0
    for batch in loader:
        if cuda:
            # Copies on a side stream: announce them, so the batch's slot is reused only once they are done.
            with torch.cuda.stream(copy_stream):
                x = batch["image"].to(dev, non_blocking=True)
                y = batch["label"].to(dev, non_blocking=True)
            record_stream(batch, copy_stream)
            torch.cuda.current_stream().wait_stream(copy_stream)
        else:
            x, y = batch["image"], batch["label"]
        # ... the model's step would run here; x.float().mean() stands in for it.
        _ = x.float().mean() + y.float().mean()
        seen += 1
        # Dropping `batch` (rebinding it next iteration) is what lets its slot go back to the ring.
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"{seen} batches in {dt:.2f} s ({seen / dt:.0f} batches/s); loader stats: {loader.stats}")
    loader.close()


if __name__ == "__main__":
    main()
