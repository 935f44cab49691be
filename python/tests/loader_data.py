# SPDX-License-Identifier: MIT
"""Datasets for the pinned DataLoader tests, in a module of their own so spawn/forkserver workers import them."""

from __future__ import annotations

import collections
import os
import signal
import time
from typing import Any, Dict

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

Point = collections.namedtuple("Point", ["x", "y"])


class Nested(Dataset):
    """Every kind of leaf default_collate knows: tensors, numpy arrays and scalars, numbers, strings, nested
    dicts, lists, tuples and namedtuples. Values depend on the index, so a mixed-up batch shows."""

    def __init__(self, n: int = 48, side: int = 8) -> None:
        self.n = n
        self.side = side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 256, (3, self.side, self.side), generator=g, dtype=torch.uint8)
        return {
            "img": img,
            "f": torch.rand(5, generator=g),
            "label": i,
            "weight": i * 0.5,
            "flag": bool(i % 2),
            "name": f"sample-{i}",
            "raw": b"b%d" % i,
            "np": np.arange(4, dtype=np.int16) + i,
            "npscalar": np.float32(i) / 3,
            "meta": {"id": i, "tags": ["a", f"t{i}"], "pair": (i, float(-i))},
            "point": Point(torch.tensor([i, i + 1]), i * 2),
            "empty": torch.zeros((0, 3)),
            "half": torch.full((2,), i, dtype=torch.float16),
            "i64": torch.tensor([i * 1000003], dtype=torch.int64),
        }


class Images(Dataset):
    """uint8 images; index-dependent content."""

    def __init__(self, n: int = 64, shape: tuple = (3, 32, 32), sleep_s: float = 0.0) -> None:
        self.n = n
        self.shape = shape
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        t = torch.empty(self.shape, dtype=torch.uint8)
        t.view(-1)[:] = torch.arange(t.numel(), dtype=torch.int64).add_(i * 7).remainder_(251).to(torch.uint8)
        return t, i


class Growing(Dataset):
    """Samples whose size grows with the index: the probe (index 0) sizes slots too small for the later ones."""

    def __init__(self, n: int = 32) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        size = 64 if i < 8 else 4096
        return torch.full((size,), i, dtype=torch.int32)


class Killer(Dataset):
    """Kills its own worker process (SIGKILL) when it reaches index kill_at."""

    def __init__(self, n: int = 64, kill_at: int = 20) -> None:
        self.n = n
        self.kill_at = kill_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.kill_at and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((16,), i, dtype=torch.int64)


class Stream(IterableDataset):
    """An iterable dataset (not probed: its first iterator measures)."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.full((8,), i, dtype=torch.float32)


def collate_pairs(samples):
    """A custom collate_fn: a dict of stacked tensors plus a list."""
    return {"x": torch.stack([s[0] for s in samples]), "ids": [s[1] for s in samples], "n": len(samples)}


def seed_worker(worker_id: int) -> None:
    np.random.seed(torch.initial_seed() % 2**32)
