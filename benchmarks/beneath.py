"""What the descriptor API costs: reading project files through ``dsh.core.beneath`` against the
reader it replaces, side by side in one run.

    python benchmarks/beneath.py [--rounds 15] [--files 20] [--depth 3]

The old readers resolved a path by name and opened it again (``Path.resolve(strict=True)``,
the roots check, then ``dsh.core.files.read_regular``); the new one resolves beneath the
folder's descriptor in one ``openat2`` and reads that descriptor (and, where ``openat2`` is
missing, walks the components with ``O_NOFOLLOW``: shown as its own column). Each round reads
``--files`` files of 4 KiB ``--depth`` folders down, 200 times, with each reader in turn
(interleaved, so the machine's noise falls on all of them); the figure is the best round's
time per read and the ratio of the medians. The target: within 5% of the old reader.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _old(root: Path, rel: str) -> bytes:
    from dsh.core.files import read_regular

    real = (root / rel).resolve(strict=True)
    real.relative_to(root)  # the roots check of the readers it replaces
    return read_regular(real, 1 << 20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args()

    from dsh.core import beneath

    root = Path(tempfile.mkdtemp(prefix="dsh-bench-beneath-")).resolve()
    folder = root.joinpath(*(f"d{i}" for i in range(args.depth)))
    folder.mkdir(parents=True)
    rels = []
    for i in range(args.files):
        (folder / f"f{i}.md").write_bytes(os.urandom(2048).hex().encode())
        rels.append(str((folder / f"f{i}.md").relative_to(root)))

    def new(r: Path, rel: str) -> bytes:
        return beneath.read(r, rel, 1 << 20)

    def walk(r: Path, rel: str) -> bytes:
        saved = beneath._openat2_state[:]
        beneath._openat2_state[:] = [None]
        try:
            return beneath.read(r, rel, 1 << 20)
        finally:
            beneath._openat2_state[:] = saved

    readers = {"old (resolve + read_regular)": _old, "beneath (openat2)": new,
               "beneath (O_NOFOLLOW walk)": walk}
    for fn in readers.values():  # warm: the same bytes from each
        assert fn(root, rels[0]) == (root / rels[0]).read_bytes()
    times: dict[str, list[float]] = {name: [] for name in readers}
    reads = 200 * len(rels)
    for _ in range(args.rounds):
        for name, fn in readers.items():
            start = time.perf_counter()
            for _ in range(200):
                for rel in rels:
                    fn(root, rel)
            times[name].append((time.perf_counter() - start) / reads)
    base = statistics.median(times["old (resolve + read_regular)"])
    print(f"python {sys.version.split()[0]}, {args.files} files of 4 KiB at depth "
          f"{args.depth}, {args.rounds} rounds of {reads} reads; openat2: "
          f"{'yes' if beneath._openat2() is not None else 'no'}")
    print(f"{'reader':<32} {'best µs/read':>13} {'median':>9} {'ratio':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<32} {min(ts) * 1e6:>13.2f} {med * 1e6:>9.2f} {med / base:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
