#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The docs_figures test (label docs): every measured figure README.md quotes appears on docs/benchmarks.md,
so the README's numbers come from the benchmarks page (where each has its machine, date and command) and
not the other way round.

A figure is a number, or a range of two, followed by a unit of rate, time or ratio: GB/s, GiB/s, MB/s,
µs, ms, s, min, or ×, as in "55.2 GB/s", "3.8–4.3 s", "1.07×". Sizes (MiB, GiB), counts and settings are
not figures. Code blocks are skipped. Each figure must appear on the benchmarks page as the README writes
it (white space folded).

usage: check-figures.py SOURCE_DIR [README [BENCHMARKS]]
Exits 0 when every figure is found, 1 naming each one missing (and the README line it is on), 2 on bad
usage or an unreadable file.
"""
import os
import re
import sys

NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
FIGURE = re.compile(
    r"(?<![\w.])(" + NUM + r"(?:\s*[–-]\s*" + NUM + r")?)\s?(GB/s|GiB/s|MB/s|µs|ms|min|s|×)(?![\w/])"
)
FENCE = re.compile(r"^\s*```")


def fold(text):
    return re.sub(r"\s+", " ", text)


def figures(text):
    """(line number, figure as written) for every figure outside fenced code blocks."""
    out, in_code = [], False
    for no, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        for m in FIGURE.finditer(line):
            out.append((no, fold(m.group(0))))
    return out


def self_test():
    """The extractor finds what it must and nothing else, so that the check can fail."""
    sample = "copies at 55.2 GB/s, warm in 3.8–4.3 s, 1.07× stock, 2 MiB chunks, 64 << 20\n```\n9 s\n```\n"
    got = [f for _, f in figures(sample)]
    want = ["55.2 GB/s", "3.8–4.3 s", "1.07×"]
    if got != want:
        sys.exit(f"check-figures.py: self-test: found {got}, want {want}: fix the FIGURE pattern")


def main():
    if len(sys.argv) not in (2, 3, 4):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    root = sys.argv[1]
    readme = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "README.md")
    bench = sys.argv[3] if len(sys.argv) > 3 else os.path.join(root, "docs", "benchmarks.md")
    self_test()
    try:
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        with open(bench, encoding="utf-8") as f:
            page = fold(f.read())
    except OSError as e:
        print(f"check-figures.py: {e}", file=sys.stderr)
        sys.exit(2)
    found = figures(text)
    missing = [(no, fig) for no, fig in found if fig not in page]
    for no, fig in missing:
        print(f"{readme}:{no}: the figure '{fig}' is not on {bench}: add it there, with its machine, date and "
              f"command (its headline table), or quote one that is")
    if missing:
        sys.exit(1)
    print(f"{len(found)} figures in {os.path.basename(readme)}, each on {os.path.basename(bench)}")


if __name__ == "__main__":
    main()
