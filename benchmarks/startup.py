"""Cold start of a one-shot run, side by side with a bare interpreter.

    python benchmarks/startup.py [--runs 20] [--against OTHER_PYTHON]

Measures, interleaved in one run with the same interpreter, ``dsh run -m echo hi`` (a real
session ledger written under a temporary DSH_HOME, installed plugins discovered), ``dsh
--help``, ``dsh --version`` and the baseline ``python -c pass``, and prints for each the
median wall time and the median CPU time (user + system, read from ``RUSAGE_CHILDREN``) and
both as ratios against the baseline measured in the same run, and against the *design
floor* (below), also measured in the same run. CPU is the steadier figure on a shared machine
(another process's work delays the child but is not charged to it); wall is what a user
waits. Targets: ``dsh run -m echo hi`` ≤ 1.4x the design floor, ``dsh --help`` and
``dsh --version`` ≤ 1.1x.

Run it with the interpreter of a non-editable venv (``VENV/bin/python benchmarks/startup.py``)
and *with* bytecode: a user's venv has ``__pycache__`` written by pip, so unset
``PYTHONDONTWRITEBYTECODE`` (the script warns when it is set, and makes one warm-up run of
each command so that any missing ``.pyc`` is written before timing).

The *design floor* line imports only what DESIGN.md puts on the path of every run —
``click`` (the CLI), ``attrs`` (events and messages are attrs classes), ``pluggy`` (the plugin
tree), and ``json``/``pathlib`` — and does nothing else: no dsh code, no class built, no
ledger written. ``dsh run`` cannot start faster than it without taking one of them off its
path.

``--against OTHER_PYTHON``: also time ``dsh run -m echo hi`` from a second venv, interleaved,
and print its ratio against this one (issue 28: dsh-otel installed but not enabled vs not
installed; target 1.00 within noise).
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
from pathlib import Path


def dsh_command(python: str) -> list[str]:
    script = Path(python).with_name("dsh")
    if script.exists():
        return [str(script)]
    return [python, "-m", "dsh"]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run of ``cmd``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--against", help="another venv's python: its `dsh run` timed beside")
    args = ap.parse_args()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set; a user's venv has bytecode "
              "(unset it to measure what a user sees)", file=sys.stderr)
    home = tempfile.mkdtemp(prefix="dsh-startup-")
    env = {**os.environ, "DSH_HOME": home, "XDG_CONFIG_HOME": home}
    env.pop("DSH_CONFIG", None)
    dsh = dsh_command(sys.executable)
    commands: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "dsh run -m echo hi": [*dsh, "run", "-m", "echo", "hi"],
        "dsh --help": [*dsh, "--help"],
        "dsh --version": [*dsh, "--version"],
        # What the design card puts on every run's path before any line of dsh: the Click
        # CLI, attrs classes, pluggy's plugin tree, and the stdlib modules every one of them
        # imports (DESIGN.md). The floor a redesign within that card could reach.
        "design floor (see docstring)": [
            sys.executable, "-c", "import click, attrs, pluggy, json, pathlib"],
    }
    if args.against:
        commands["dsh run -m echo hi (--against)"] = [
            *dsh_command(args.against), "run", "-m", "echo", "hi"]
    for cmd in commands.values():  # warm the page cache, write any missing bytecode
        timed(cmd, env)
    walls: dict[str, list[float]] = {k: [] for k in commands}
    cpus: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            w, c = timed(cmd, env)
            walls[name].append(w)
            cpus[name].append(c)
    sessions = list(Path(home, "sessions").glob("*.jsonl"))
    expected = (args.runs + 1) * (2 if args.against else 1)
    assert len(sessions) == expected, "every dsh run must have written its ledger"
    bw = statistics.median(walls["python -c pass"])
    bc = statistics.median(cpus["python -c pass"])
    floor = "design floor (see docstring)"
    fw, fc = statistics.median(walls[floor]), statistics.median(cpus[floor])
    print(f"median of {args.runs} interleaved runs; baseline = python -c pass, same run")
    print(f"{'command':34} {'wall ms':>8} {'/ base':>7} {'cpu ms':>8} {'/ base':>7}"
          f" {'/ floor':>8} {'cpu/fl':>7}")
    for name in commands:
        w, c = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:34} {w * 1e3:8.1f} {w / bw:6.2f}x {c * 1e3:8.1f} {c / bc:6.2f}x"
              f" {w / fw:7.2f}x {c / fc:6.2f}x")
    print("targets (/ floor): dsh run -m echo hi <= 1.4x; dsh --help, dsh --version <= 1.1x")
    if args.against:
        a = "dsh run -m echo hi (--against)"
        ratios_w = [x / y for x, y in zip(walls[a], walls["dsh run -m echo hi"], strict=True)]
        ratios_c = [x / y for x, y in zip(cpus[a], cpus["dsh run -m echo hi"], strict=True)]
        print(f"--against / this venv, median of per-pair ratios: wall "
              f"{statistics.median(ratios_w):.2f}x, cpu {statistics.median(ratios_c):.2f}x")


if __name__ == "__main__":
    main()
