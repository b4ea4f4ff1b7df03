"""Cold start of a one-shot run, side by side with a bare interpreter.

    python benchmarks/startup.py [--runs 20]

Measures, interleaved in one run with the same interpreter, the wall time of
``dsh run -m echo hi`` (a real session ledger written under a temporary DSH_HOME, installed
plugins discovered) and of ``python -c pass``, and prints the medians and their ratio.
Target: ≤ 8x (``llm -m echo hi`` measured 72x on these machines, almost all of it imports).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def dsh_command() -> list[str]:
    script = Path(sys.executable).with_name("dsh")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "dsh"]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="dsh-startup-")
    env = {**os.environ, "DSH_HOME": home, "XDG_CONFIG_HOME": home}
    env.pop("DSH_CONFIG", None)
    dsh = [*dsh_command(), "run", "-m", "echo", "hi"]
    bare = [sys.executable, "-c", "pass"]
    for cmd in (dsh, bare):  # warm the page cache
        timed(cmd, env)
    d_times, b_times = [], []
    for _ in range(args.runs):
        d_times.append(timed(dsh, env))
        b_times.append(timed(bare, env))
    d, b = statistics.median(d_times), statistics.median(b_times)
    sessions = list(Path(home, "sessions").glob("*.jsonl"))
    assert len(sessions) == args.runs + 1, "every dsh run must have written its ledger"
    print(f"python -c pass:        {b * 1e3:7.1f} ms (median of {args.runs})")
    print(f"dsh run -m echo hi:    {d * 1e3:7.1f} ms (median of {args.runs}, ledger written)")
    print(f"ratio: {d / b:.1f}x  (target <= 8x)")


if __name__ == "__main__":
    main()
