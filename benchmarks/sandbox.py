"""What the kernel sandbox costs per command: a paired figure, sandboxed vs unconfined.

    python benchmarks/sandbox.py [--runs 40] [--command true] [--ballast-mb 0]

Each round spawns the trivial command three times, in an order that rotates from round to
round, and waits for each: through ``subprocess.Popen`` (unconfined), through
``dsh.sandbox.Popen`` under the default policy on the path it uses (the forked child confines
itself by system calls prepared in the parent: ``dsh/sandbox/child.py``), and through the
same ``Popen`` with ``launcher=True`` (the old path, still used by ``dsh.sandbox.wrap``: a
second interpreter started with ``-I -S`` applies Landlock and seccomp, then ``execve``'s).

Printed per path: the median and best wall time, the median of the paired differences
against the unconfined spawn of the same round (the overhead per command: the issue-22
figure, target at most +15 ms on this machine), and the CPU per spawn — dsh's own (building
the plan, the ruleset, the fork) and the children's — which load does not inflate the way it
does wall time. The machine is shared: compare the columns of one run. ``--ballast-mb N``
first fills N MiB of this process's memory (a dsh with many plugins and a long session is
bigger than this script): the confined path forks this process, whose cost grows with its
size, where ``subprocess`` alone uses ``vfork``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from dsh.sandbox.policy import Policy
from dsh.sandbox.spawn import Popen

PATHS = ("unconfined", "sandboxed", "launcher")


def once(path: str, argv: list[str], ws: str) -> tuple[float, float, float]:
    """``(wall ms, dsh CPU ms, children CPU ms)`` of one spawn-and-wait by ``path``."""
    before_children, before_self = _cpu(resource.RUSAGE_CHILDREN), time.process_time()
    start = time.perf_counter()
    if path == "unconfined":
        proc: subprocess.Popen[bytes] = subprocess.Popen(argv, cwd=ws, stdin=subprocess.DEVNULL,
                                                         close_fds=True)
    else:
        proc = Popen(argv, Policy(), workspace=ws, stdin=subprocess.DEVNULL,
                     launcher=path == "launcher")
    proc.wait()
    wall = (time.perf_counter() - start) * 1000
    return (wall, (time.process_time() - before_self) * 1000,
            _cpu(resource.RUSAGE_CHILDREN) - before_children)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return (usage.ru_utime + usage.ru_stime) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--command", default="true")
    parser.add_argument("--ballast-mb", type=int, default=0)
    args = parser.parse_args()
    ballast = bytearray(os.urandom(1 << 20) * args.ballast_mb)  # touched, resident  # noqa: F841
    argv = args.command.split()
    got: dict[str, list[tuple[float, float, float]]] = {p: [] for p in PATHS}
    with tempfile.TemporaryDirectory(prefix="dsh-bench-sandbox-") as ws:
        for path in PATHS:  # warm the page cache and the caches of each path
            once(path, argv, ws)
        for i in range(args.runs):
            for path in PATHS[i % 3:] + PATHS[:i % 3]:
                got[path].append(once(path, argv, ws))
    load = os.getloadavg()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"spawn of {args.command!r}, {args.runs} rounds, load {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} ({os.cpu_count()} cores), python {sys.version.split()[0]}, "
          f"this process {rss:.0f} MiB")
    bare = got["unconfined"]
    for path in PATHS:
        rows = got[path]
        walls = [r[0] for r in rows]
        own, kids = statistics.median(r[1] for r in rows), statistics.median(r[2] for r in rows)
        line = (f"  {path:<10}  wall median {statistics.median(walls):7.2f} ms  best "
                f"{min(walls):7.2f} ms  CPU dsh {own:5.2f} + children {kids:5.2f} ms")
        print(line)
    print("  paired overhead per command (median of round-by-round differences):")
    for path in PATHS[1:]:
        rows = got[path]
        wall = [r[0] - b[0] for r, b in zip(rows, bare, strict=True)]
        cpu = [r[1] + r[2] - b[1] - b[2] for r, b in zip(rows, bare, strict=True)]
        note = "  <- the path Popen uses" if path == "sandboxed" else "  (old path, wrap())"
        print(f"  {path:<10}  wall {statistics.median(wall):+7.2f} ms  CPU "
              f"{statistics.median(cpu):+7.2f} ms  (target <= +15 ms){note}")


if __name__ == "__main__":
    main()
