"""What the kernel sandbox costs per command: a paired figure, sandboxed vs unconfined.

    python benchmarks/sandbox.py [--runs 40] [--command true]

Each round spawns the trivial command twice — once through ``dsh.sandbox.Popen`` under the
default policy (the launcher: an interpreter start with ``-I -S``, Landlock, seccomp, then
``execve``) and once through ``subprocess.Popen`` with the same arguments, in alternating
order — and waits for each. Printed: the median and best of each, and the median of the
paired differences (the overhead per command), and the children's CPU time per spawn (which
load does not inflate the way it does wall time). Target (issue 22): at most +15 ms on this
machine. The machine is shared: compare the columns of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from dsh.sandbox.policy import Policy
from dsh.sandbox.spawn import Popen


def once(confined: bool, argv: list[str], ws: str) -> float:
    """Wall ms of one spawn-and-wait; the children's CPU goes to :data:`CPU`."""
    before = _children_cpu()
    start = time.perf_counter()
    if confined:
        proc: subprocess.Popen[bytes] = Popen(argv, Policy(), workspace=ws,
                                              stdin=subprocess.DEVNULL)
    else:
        proc = subprocess.Popen(argv, cwd=ws, stdin=subprocess.DEVNULL, close_fds=True)
    proc.wait()
    wall = (time.perf_counter() - start) * 1000
    CPU[confined].append(_children_cpu() - before)
    return wall


#: CPU ms (user + system) of the spawned processes, per spawn: stable under load, unlike wall.
CPU: dict[bool, list[float]] = {True: [], False: []}


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    argv = args.command.split()
    with tempfile.TemporaryDirectory(prefix="dsh-bench-sandbox-") as ws:
        once(True, argv, ws)  # warm the page cache
        confined, bare, diffs = [], [], []
        for i in range(args.runs):
            if i % 2:
                b, c = once(False, argv, ws), once(True, argv, ws)
            else:
                c, b = once(True, argv, ws), once(False, argv, ws)
            confined.append(c)
            bare.append(b)
            diffs.append(c - b)
    load = os.getloadavg()[0]
    print(f"spawn of {args.command!r}, {args.runs} pairs, load {load:.2f} "
          f"({os.cpu_count()} cores), python {sys.version.split()[0]}")
    print(f"  unconfined  median {statistics.median(bare):7.2f} ms  best {min(bare):7.2f} ms")
    print(f"  sandboxed   median {statistics.median(confined):7.2f} ms  "
          f"best {min(confined):7.2f} ms")
    print(f"  overhead    median {statistics.median(diffs):+7.2f} ms per command "
          f"(best pair {min(diffs):+.2f} ms; target <= +15 ms)")
    cpu_c, cpu_b = statistics.median(CPU[True]), statistics.median(CPU[False])
    print(f"  child CPU   median {cpu_b:7.2f} ms unconfined, {cpu_c:7.2f} ms sandboxed "
          f"({cpu_c - cpu_b:+.2f} ms: the launcher's interpreter start, ctypes, Landlock, "
          "seccomp)")


if __name__ == "__main__":
    main()
