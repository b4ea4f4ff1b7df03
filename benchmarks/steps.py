"""CPU cost of one agent step, and how it grows with the session's length.

    python benchmarks/steps.py [--n 200] [--k 10000]

Scripted model, one trivial tool call per step, unobserved run, ledger on disk with the
default fsync policy (every step boundary), then with fsync off to separate dsh's own cost
from the kernel's price of durability. Prints:

* CPU µs per step over a 200-step turn, both ways, each as a ratio to its floor (below):
  targets ≤ 3x with ``fsync = "never"`` (dsh's own cost), ≤ 1.5x with the default fsync;
  then what the fsync adds to dsh's step against what it adds to the floor's;
* CPU µs per step around step k=10 and around step k=10,000 of one long turn, measured in
  the same process, and their ratio (target ≤ 1.2: the per-step cost must not grow);
* CPU µs per step with the built-in ``dsh.tasks`` and ``dsh.memory`` enabled and their state
  empty, against without (issue 25; target ≤ 1.10);
* CPU µs per step with dsh-shell's twelve workbench tools enabled but never called, against
  without (their schemas are in every request; target ≤ 1.10).

Every figure is also printed as a ratio against a baseline measured in the same run (issue
27): the *floor*, a loop doing the least a step must do — encode five event-sized dicts with
``json.dumps`` and ``os.write`` each to a file (and ``os.fsync`` once, for the default policy)
— so a figure from a loaded machine can be compared with one from a quiet one.

``--instructions`` (needs valgrind) also counts the instructions of a step under
callgrind — a figure no other process on the machine can move: a fresh process runs a 20-step
warm-up turn and then an N-step turn, and N = 100's count is subtracted from N = 300's (the
imports, the warm-up and per-turn costs cancel) — with and without dsh-shell's workbench.

``--autoload`` loads every installed plugin too (``dsh run`` without a config does): run it
in two venvs, one with a plugin installed and one without, to see what merely installing it
costs (issue 28: dsh-otel installed but not enabled).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import bench_app  # noqa: E402
from benchmarks._common import step_marks  # noqa: E402
from benchmarks._common import tmpdir  # noqa: E402
from benchmarks._common import tool_loop_script  # noqa: E402
from dsh.llm.builtin import ScriptedModel  # noqa: E402

AUTOLOAD = False

EVENT = {"v": 1, "seq": 12345, "ts": "2026-12-01T16:00:00.000Z", "session": "20261201-160000",
         "type": "tool/call", "call_id": "call_1", "name": "noop", "arguments": {"x": 1}}


def floor_cpu(steps: int, fsync: str = "step") -> float:
    """CPU µs per step of the floor: five events encoded and written, one fsync per step."""
    path = os.path.join(tmpdir(), "floor.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        t0 = time.process_time()
        for _ in range(steps):
            for _ in range(5):
                os.write(fd, (json.dumps(EVENT) + "\n").encode())
            if fsync != "never":
                os.fsync(fd)
        return (time.process_time() - t0) / steps * 1e6
    finally:
        os.close(fd)


def per_step_cpu(steps: int, fsync: str = "step", state: bool = False,
                 workbench: bool = False) -> float:
    plugins = {"dsh.tasks": {"enabled": True}, "dsh.memory": {"enabled": True}} if state else {}
    load: tuple[str, ...] = ()
    if workbench:  # dsh-shell's twelve tools registered and sent, never called
        load = ("dsh_shell",)
        plugins["shell"] = {"workspace": tmpdir()}
    app = bench_app(tmpdir(), fsync=fsync, plugins=plugins, autoload=AUTOLOAD, load=load)
    agent = app.agent(model="echo")
    agent._model = ScriptedModel("", {"responses": tool_loop_script(steps)})
    gc.collect()
    with app.open_session(agent) as s:
        t0 = time.process_time()
        result = s.send("go")
        cpu = time.process_time() - t0
    assert result.outcome == "completed" and result.steps == steps, result.reason
    return cpu / steps * 1e6


#: One process for ``--instructions``: a warm-up turn, then an N-step turn (fsync never).
IR_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from benchmarks._common import bench_app, tmpdir, tool_loop_script
from dsh.llm.builtin import ScriptedModel
steps, workbench = int(sys.argv[2]), sys.argv[3] == "1"
kw = {"load": ("dsh_shell",), "plugins": {"shell": {"workspace": tmpdir()}}} if workbench else {}
app = bench_app(tmpdir(), fsync="never", **kw)
agent = app.agent(model="echo")
agent._model = ScriptedModel("", {"responses": tool_loop_script(20) + tool_loop_script(steps)})
with app.open_session(agent) as s:
    s.send("warm")
    s.send("go")
"""


def instructions_per_step(workbench: bool = False) -> float:
    """Instructions of one step, counted by callgrind (see the module's docstring)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def count(steps: int) -> int:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
             "-c", IR_CHILD, root, str(steps), "1" if workbench else "0"],
            capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"})
        found = [line.split()[-1] for line in out.stderr.splitlines() if "Collected :" in line]
        if not found:
            raise SystemExit(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
        return int(found[-1])

    return (count(300) - count(100)) / 200


def growth(k: int, window: int) -> tuple[float, float]:
    marks = step_marks(k + window + 1)

    def window_cost(start: int) -> float:
        return (marks[start + window] - marks[start]) / window * 1e6

    return window_cost(10), window_cost(k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="steps in the per-step measurement")
    ap.add_argument("--k", type=int, default=10_000, help="session length for the growth ratio")
    ap.add_argument("--window", type=int, default=500, help="steps averaged at each point")
    ap.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    ap.add_argument("--autoload", action="store_true", help="load every installed plugin")
    ap.add_argument("--no-growth", action="store_true", help="skip the k=10,000 run")
    ap.add_argument("--instructions", action="store_true",
                    help="also count a step's instructions under valgrind (about a minute)")
    args = ap.parse_args()
    if args.instructions and not shutil.which("valgrind"):
        ap.error("--instructions needs valgrind on PATH")
    global AUTOLOAD
    AUTOLOAD = args.autoload
    per_step_cpu(args.n, "never")  # warm-up: lazy imports, caches
    bests: dict[str, tuple[float, float]] = {}
    for policy in ("step", "never"):
        best = floor = float("inf")
        for _ in range(args.repeat):  # interleaved: dsh, floor, dsh, floor…
            best = min(best, per_step_cpu(args.n, policy))
            floor = min(floor, floor_cpu(args.n, policy))
        bests[policy] = best, floor
        label = "default fsync=step" if policy == "step" else "fsync=never"
        target = 1.5 if policy == "step" else 3
        print(f"cpu per step (N={args.n}, {label}, best of {args.repeat}): {best:.1f} us; "
              f"floor {floor:.1f} us; ratio {best / floor:.2f}x  (target <= {target}x)")
    # The kernel's CPU for an fsync grows with the work done between two of them (the floor
    # does none): what it adds to each, measured as the difference of the two policies.
    (d_step, f_step), (d_never, f_never) = bests["step"], bests["never"]
    print(f"the fsync's own share: {d_step - d_never:.1f} us of dsh's step, "
          f"{f_step - f_never:.1f} us of the floor's")
    if not args.no_growth:
        early, late = growth(args.k, args.window)
        ratio = late / early
        print(f"cpu per step at k=10: {early:.1f} us; at k={args.k}: {late:.1f} us")
        print(f"growth ratio step(k={args.k}) / step(k=10): {ratio:.2f}  (target <= 1.2)")
    off = on = float("inf")
    for _ in range(args.repeat):  # interleaved
        off = min(off, per_step_cpu(args.n, "never"))
        on = min(on, per_step_cpu(args.n, "never", state=True))
    print(f"cpu per step with dsh.tasks + dsh.memory enabled, empty state: {on:.1f} us; "
          f"without: {off:.1f} us; ratio {on / off:.2f}  (target <= 1.10)")
    try:
        import dsh_shell  # noqa: F401
    except ImportError:
        if args.instructions:
            print(f"instructions per step (callgrind): {instructions_per_step():,.0f}")
        return
    off = on = float("inf")
    for _ in range(args.repeat):  # interleaved
        off = min(off, per_step_cpu(args.n, "never"))
        on = min(on, per_step_cpu(args.n, "never", workbench=True))
    print(f"cpu per step with dsh-shell's workbench tools enabled, unused: {on:.1f} us; "
          f"without: {off:.1f} us; ratio {on / off:.2f}  (target <= 1.03)")
    if args.instructions:
        plain, bench = instructions_per_step(), instructions_per_step(workbench=True)
        print(f"instructions per step (callgrind): {plain:,.0f}; with the workbench "
              f"registered, unused: {bench:,.0f}; ratio {bench / plain:.4f}  (target <= 1.03)")


if __name__ == "__main__":
    main()
