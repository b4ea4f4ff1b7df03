"""dsh side by side with llm (llm-echo) and pydantic-ai (FunctionModel): the same workloads.

    pip install -e '.[bench]' ./plugins/dsh-shell
    python benchmarks/compare.py [--runs 10] [--n 200] [--k 10000] [--k-other 2000]

Every model is offline (dsh's ``echo``/scripted model, ``llm-echo``, pydantic-ai's
``FunctionModel``); nothing talks to the network. A framework that is not installed gets
"not installed" in its column and dsh's figures are printed anyway. Workloads:

1. **Cold start of a one-shot run**: wall time of a fresh process doing one prompt, median of
   ``--runs``, the commands interleaved: ``dsh run -m echo hi`` (writes its session ledger
   under a temporary DSH_HOME), ``llm -m echo hi`` (logs to ``logs.db`` under a temporary
   LLM_USER_PATH), and ``python -c SCRIPT`` that imports pydantic_ai, builds an ``Agent`` on a
   ``FunctionModel`` answering a fixed text and calls ``agent.run_sync("hi")``. The baseline
   is ``python -c pass``. Each child's peak RSS is read from ``os.wait4``.
2. **CPU per step at N=200**: one in-process run of ``--n`` steps in which the model asks for
   one call of a trivial tool (``noop(x: int) -> int``) per step, then answers; the
   ``time.process_time()`` around the run divided by the steps, best of ``--repeat``. dsh as in
   ``benchmarks/steps.py`` (scripted model, ledger on disk, with the default fsync=step and
   with fsync=never). pydantic-ai: an ``Agent`` with one ``@agent.tool_plain`` and a
   ``FunctionModel`` whose async function returns a ``ToolCallPart`` for the first N-1
   requests, then text (async: a plain function would run in a worker thread); its
   responses carry their usage so no token estimate is computed; no request limit. llm:
   llm-echo only calls the tools named in the JSON of the *user's* prompt and a chain's
   follow-up prompts have empty text, so an llm chain stops after one tool round; a probe
   shows it, and the column says n/a rather than measuring another workload.
3. **Step-cost growth**: CPU per step averaged over a window of steps starting at step k=10,
   at k=``--k-other`` and at k=``--k``, all read from one long run (as ``steps.py``'s
   ``growth()``), and the ratio to k=10. pydantic-ai's per-step cost is linear in the length
   of the history, so its run stops at ``--k-other`` (default 2000, ~90 s) and its window is
   ``--window-other`` (200) instead of ``--window`` (500, as ``steps.py``); dsh also reports
   that k so the two are compared at the same point.
4. **Peak RSS**: the 200-step workload of (2) in a fresh process (this script with
   ``--child``), peak RSS from ``os.wait4``, median of 3; plus the one-shot runs of (1).

Tables are Markdown; ratio columns are framework / dsh.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NOT_INSTALLED = "not installed (pip install -e '.[bench]')"
OTHERS = ("llm", "pydantic-ai")
RSS_RUNS = 3

PA_ONE_SHOT = """\
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import FunctionModel


async def answer(messages, info):
    return ModelResponse(parts=[TextPart("hi")])


agent = Agent(FunctionModel(answer))
print(agent.run_sync("hi").output)
"""

Cell = float | None


# --------------------------------------------------------------------------------------------
# What is installed
# --------------------------------------------------------------------------------------------


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _script(name: str) -> list[str]:
    """The console script next to this interpreter, else ``python -m name``."""
    script = Path(sys.executable).with_name(name)
    return [str(script)] if script.exists() else [sys.executable, "-m", name]


def missing(framework: str) -> str | None:
    """None when ``framework`` can run here, else why not."""
    if framework == "llm":
        found = all(importlib.util.find_spec(m) for m in ("llm", "llm_echo"))
        return None if found else NOT_INSTALLED
    if framework == "pydantic-ai":
        spec = importlib.util.find_spec("pydantic_ai")
        places = (spec.submodule_search_locations or []) if spec else []
        ok = any(Path(p, "models", "function.py").exists() for p in places)
        return None if ok else NOT_INSTALLED
    return None


def versions() -> list[str]:
    found = [_version("dsh"), _version("llm"), _version("llm-echo"),
             _version("pydantic-ai-slim", "pydantic-ai")]
    return [v for v in found if v]


# --------------------------------------------------------------------------------------------
# Child processes: wall time and peak RSS
# --------------------------------------------------------------------------------------------


#: Runs each command it reads (a JSON line) and answers [wall s, ru_maxrss, exit status].
#: On Linux a child's ru_maxrss starts at the peak RSS of the process that spawned it (the
#: spawner's memory is the child's until exec), so the spawner is a bare interpreter (-I -S,
#: ~10 MiB, less than ``python -c pass``) rather than this process, whose heap holds the
#: in-process workloads. stdin is /dev/null and stdout is discarded for every command.
SPAWNER = """\
import json, os, sys, time
io = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
      (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
for line in sys.stdin:
    cmd, env = json.loads(line)
    t0 = time.perf_counter()
    pid = os.posix_spawn(cmd[0], cmd, env, file_actions=io)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    print(json.dumps([wall, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]), flush=True)
"""


class Spawner:
    """Wall time and peak RSS of child processes, measured by a small helper process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", SPAWNER],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, cmd: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
        """Run ``cmd`` to completion; return (wall seconds, peak RSS MiB) of that child."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([list(cmd), env]) + "\n")
        self.proc.stdin.flush()
        wall, maxrss, status = json.loads(self.proc.stdout.readline())
        if status != 0:
            raise SystemExit(f"{' '.join(cmd)!r} failed with exit status {status}")
        return wall, maxrss / (2**20 if sys.platform == "darwin" else 2**10)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


# --------------------------------------------------------------------------------------------
# Workload 1: cold start of a one-shot run
# --------------------------------------------------------------------------------------------


def cold_start(spawner: Spawner, runs: int,
               available: dict[str, bool]) -> dict[str, tuple[float, float]]:
    """Median (wall ms, peak RSS MiB) per command, the commands interleaved in each round."""
    home = tempfile.mkdtemp(prefix="dsh-compare-")
    env = {**os.environ, "DSH_HOME": home, "XDG_CONFIG_HOME": home,
           "LLM_USER_PATH": os.path.join(home, "llm")}
    env.pop("DSH_CONFIG", None)
    commands: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "dsh": [*_script("dsh"), "run", "-m", "echo", "hi"],
    }
    if available["llm"]:
        commands["llm"] = [*_script("llm"), "-m", "echo", "hi"]
    if available["pydantic-ai"]:
        commands["pydantic-ai"] = [sys.executable, "-c", PA_ONE_SHOT]
    for cmd in commands.values():  # warm the page cache
        spawner.run(cmd, env)
    walls: dict[str, list[float]] = {name: [] for name in commands}
    rss: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            wall, peak = spawner.run(cmd, env)
            walls[name].append(wall * 1e3)
            rss[name].append(peak)
    ledgers = list(Path(home, "sessions").glob("*.jsonl"))
    assert len(ledgers) == runs + 1, "every dsh run must have written its ledger"
    if available["llm"]:
        assert Path(home, "llm", "logs.db").exists(), "llm must have logged its responses"
    return {name: (statistics.median(walls[name]), statistics.median(rss[name]))
            for name in commands}


# --------------------------------------------------------------------------------------------
# Workloads 2-4: the tool loop, per framework
# --------------------------------------------------------------------------------------------


def dsh_step_cpu(steps: int, fsync: str) -> float:
    """CPU µs per step of one dsh turn of ``steps`` tool-calling steps (``steps.py``)."""
    from benchmarks.steps import per_step_cpu

    return per_step_cpu(steps, fsync)


def dsh_marks(steps: int) -> list[float]:
    """``time.process_time()`` at the start of every step of one dsh turn of ``steps`` steps."""
    from benchmarks._common import step_marks

    return step_marks(steps)


def pa_run(steps: int, marks: list[float] | None = None) -> float:
    """One pydantic-ai run of ``steps`` requests (``steps - 1`` tool calls, then text).

    Returns the CPU seconds of ``run_sync``; appends ``time.process_time()`` to ``marks`` at
    every model request (the start of a step).
    """
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.messages import ModelResponse
    from pydantic_ai.messages import TextPart
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.function import AgentInfo
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import RequestUsage
    from pydantic_ai.usage import UsageLimits

    count = 0

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal count
        count += 1
        if marks is not None:
            marks.append(time.process_time())
        usage = RequestUsage(input_tokens=1, output_tokens=1)
        if count < steps:
            return ModelResponse(parts=[ToolCallPart("noop", {"x": 1})], usage=usage)
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def noop(x: int) -> int:
        """Return x."""
        return x

    limits = UsageLimits(request_limit=None)
    gc.collect()
    t0 = time.process_time()
    result = agent.run_sync("go", usage_limits=limits)
    cpu = time.process_time() - t0
    assert result.output == "done" and count == steps, (result.output, count)
    return cpu


def pa_step_cpu(steps: int) -> float:
    return pa_run(steps) / steps * 1e6


def pa_marks(steps: int) -> list[float]:
    marks: list[float] = []
    pa_run(steps, marks)
    return marks


def llm_tool_loop_probe() -> str:
    """Why llm + llm-echo cannot run an N-step tool loop, shown by running one chain."""
    saved = os.environ.get("LLM_USER_PATH")
    os.environ["LLM_USER_PATH"] = tempfile.mkdtemp(prefix="dsh-compare-llm-")
    try:
        import llm

        def noop(x: int) -> int:
            """Return x."""
            return x

        prompt = json.dumps({"prompt": "go",
                             "tool_calls": [{"name": "noop", "arguments": {"x": 1}}]})
        conversation = llm.get_model("echo").conversation(tools=[noop])
        chain = conversation.chain(prompt, tools=[noop], chain_limit=0)
        responses = list(chain.responses())
    finally:
        if saved is None:
            os.environ.pop("LLM_USER_PATH", None)
        else:
            os.environ["LLM_USER_PATH"] = saved
    calls = sum(len(r.tool_calls()) for r in responses)
    seen = f"probe: {len(responses)} responses, {calls} tool call{'' if calls == 1 else 's'}"
    if len(responses) <= 2:
        return ("n/a: llm-echo calls only the tools named in the JSON of the user's prompt and "
                f"a chain's follow-up prompts are empty, so a chain ends after one tool round "
                f"({seen})")
    return f"n/a: this script has no multi-step tool loop for llm yet ({seen})"


def child(framework: str, steps: int) -> None:
    """The body of ``--child``: one ``steps``-step run, for the parent to read its peak RSS."""
    if framework == "dsh":
        dsh_step_cpu(steps, "step")
    elif framework == "pydantic-ai":
        pa_run(steps)
    else:
        raise SystemExit(f"no child workload for {framework}")


def peak_rss(spawner: Spawner, framework: str, steps: int) -> float:
    """Median peak RSS (MiB) of a fresh process doing the ``steps``-step run."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", framework, "--n", str(steps)]
    return statistics.median(spawner.run(cmd, dict(os.environ))[1] for _ in range(RSS_RUNS))


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def num(value: Cell, fmt: str = "{:.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def ratio(value: Cell, base: Cell) -> str:
    if value is None or base is None or base == 0:
        return "n/a"
    return f"{value / base:.2f}x" if value / base < 10 else f"{value / base:.1f}x"


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
          notes: Sequence[str] = ()) -> None:
    """Print a Markdown table, columns padded; the first left-aligned, the others right."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) if i == 0 else c.rjust(w)
                  for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (widths[0] + 2)] + ["-" * (w + 1) + ":" for w in widths[1:]]
    print(f"\n### {title}\n")
    print(line(headers))
    print("|" + "|".join(rule) + "|")
    for row in rows:
        print(line(row))
    if notes:
        print()
        for note in notes:
            print(f"- {note}")
    sys.stdout.flush()


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="cold starts per command (median)")
    ap.add_argument("--n", type=int, default=200, help="steps in the per-step and RSS runs")
    ap.add_argument("--repeat", type=int, default=5, help="per-step CPU: best of this many")
    ap.add_argument("--k", type=int, default=10_000, help="dsh: session length for growth")
    ap.add_argument("--k-other", type=int, default=2_000,
                    help="growth for the other frameworks (their step cost grows), capped by --k")
    ap.add_argument("--window", type=int, default=500, help="growth: steps averaged per point")
    ap.add_argument("--window-other", type=int, default=200,
                    help="growth: steps averaged per point for the other frameworks")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.n)
        return
    # Every ledger, log and session file of the run goes under one directory, removed at the end
    # (the growth run alone writes ~10 MB); children find it through TMPDIR.
    work = tempfile.mkdtemp(prefix="dsh-compare-")
    tempfile.tempdir = os.environ["TMPDIR"] = work
    spawner = Spawner()
    try:
        compare(args, spawner)
    finally:
        spawner.close()
        shutil.rmtree(work, ignore_errors=True)


def compare(args: argparse.Namespace, spawner: Spawner) -> None:
    """Run the four workloads on every installed framework and print the tables."""
    n, k = args.n, args.k
    k_other = min(args.k_other, k)
    why: dict[str, str | None] = {fw: missing(fw) for fw in OTHERS}
    available = {fw: why[fw] is None for fw in OTHERS}
    loop_na: dict[str, str] = {fw: why[fw] or "" for fw in OTHERS if why[fw]}
    absent = {fw for fw in OTHERS if why[fw]}

    def show(fw: str, value: Cell, fmt: str = "{:.1f}") -> str:
        return "not installed" if fw in absent else num(value, fmt)
    if available["llm"]:
        progress("llm: probing a tool chain with llm-echo")
        loop_na["llm"] = llm_tool_loop_probe()

    print("## dsh compared with llm and pydantic-ai")
    print(f"\npython {platform.python_version()} on {platform.system()} {platform.machine()}, "
          f"{os.cpu_count()} cores; " + ", ".join(versions()))

    def notes(table_na: dict[str, str]) -> list[str]:
        return [f"{fw}: {reason}" for fw, reason in table_na.items()]

    # 1. cold start -----------------------------------------------------------------------
    progress(f"cold start: {args.runs} interleaved rounds")
    cold = cold_start(spawner, args.runs, available)
    bare_ms, dsh_ms = cold["python -c pass"][0], cold["dsh"][0]
    labels = {"python -c pass": "python -c pass", "dsh": "dsh run -m echo hi",
              "llm": "llm -m echo hi", "pydantic-ai": "pydantic-ai run_sync (python -c)"}
    rows = []
    for name in ("python -c pass", "dsh", *OTHERS):
        ms = cold[name][0] if name in cold else None
        rows.append([labels[name], show(name, ms), ratio(ms, bare_ms), ratio(ms, dsh_ms)])
    table(f"1. Cold start of a one-shot run (wall ms, median of {args.runs})",
          ["command", "ms", "/ python -c pass", "/ dsh"], rows,
          notes({fw: r for fw, r in why.items() if r}))

    # 2. CPU per step ---------------------------------------------------------------------
    progress(f"cpu per step: N={n}, best of {args.repeat}")
    step_cpu: dict[str, Cell] = {
        "dsh": min(dsh_step_cpu(n, "step") for _ in range(args.repeat)),
        "dsh (fsync=never)": min(dsh_step_cpu(n, "never") for _ in range(args.repeat)),
        "llm": None,
        "pydantic-ai": (min(pa_step_cpu(n) for _ in range(args.repeat))
                        if available["pydantic-ai"] else None),
    }
    labels = {"dsh": "dsh (default fsync=step)", "dsh (fsync=never)": "dsh (fsync=never)",
              "llm": "llm + llm-echo", "pydantic-ai": "pydantic-ai FunctionModel"}
    rows = [[labels[fw], show(fw, v), ratio(v, step_cpu["dsh"]),
             ratio(v, step_cpu["dsh (fsync=never)"])] for fw, v in step_cpu.items()]
    table(f"2. CPU per step, N={n}, one tool call per step (us, best of {args.repeat})",
          ["framework", "us/step", "/ dsh", "/ dsh fsync=never"], rows, notes(loop_na))

    # 3. growth ---------------------------------------------------------------------------
    windows = {"dsh": args.window, "pydantic-ai": args.window_other}

    def window_cost(marks: list[float], start: int, window: int) -> float:
        return (marks[start + window] - marks[start]) / window * 1e6

    growth: dict[str, dict[int, float]] = {}
    progress(f"growth: dsh to k={k}, window {args.window}")
    marks = dsh_marks(k + args.window + 1)
    growth["dsh"] = {p: window_cost(marks, p, args.window) for p in sorted({10, k_other, k})}
    if available["pydantic-ai"]:
        progress(f"growth: pydantic-ai to k={k_other}, window {args.window_other}")
        marks = pa_marks(k_other + args.window_other + 1)
        growth["pydantic-ai"] = {p: window_cost(marks, p, args.window_other)
                                 for p in sorted({10, k_other})}
    rows = []
    for fw in ("dsh", *OTHERS):
        costs = growth.get(fw)
        if costs is None:
            rows.append([fw, "n/a", "n/a", show(fw, None), "n/a", "n/a"])
            continue
        for p, cost in costs.items():
            rows.append([fw, f"{p:,}", str(windows[fw]), num(cost), ratio(cost, costs[10]),
                         ratio(cost, growth["dsh"][p])])
    capped = {fw: f"growth measured up to k={k_other:,} only (--k-other): its step cost grows "
                  "with the length of the history" for fw in growth if fw != "dsh" and k_other < k}
    table("3. Step-cost growth: CPU per step over a window of steps from step k (us)",
          ["framework", "k", "window", "us/step", "/ same at k=10", "/ dsh at same k"], rows,
          notes({**loop_na, **capped}))

    # 4. peak RSS -------------------------------------------------------------------------
    progress(f"peak RSS: {n}-step run in a fresh process, median of {RSS_RUNS}")
    rss_steps: dict[str, Cell] = {
        "dsh": peak_rss(spawner, "dsh", n),
        "llm": None,
        "pydantic-ai": peak_rss(spawner, "pydantic-ai", n) if available["pydantic-ai"] else None,
    }
    rss_one: dict[str, Cell] = {fw: cold[fw][1] if fw in cold else None for fw in ("dsh", *OTHERS)}
    rows = [["python -c pass", num(cold["python -c pass"][1]), "", "", ""]]
    for fw in ("dsh", *OTHERS):
        rows.append([fw, show(fw, rss_one[fw]), ratio(rss_one[fw], rss_one["dsh"]),
                     show(fw, rss_steps[fw]), ratio(rss_steps[fw], rss_steps["dsh"])])
    table("4. Peak RSS of a fresh process (MiB)",
          ["framework", "one-shot run", "/ dsh", f"{n}-step run", "/ dsh"], rows,
          notes(loop_na))

    # summary -----------------------------------------------------------------------------
    def cells(label: str, fmt: str, values: dict[str, Cell]) -> list[str]:
        d = values.get("dsh")
        return [label, *(show(fw, values.get(fw), fmt) for fw in ("dsh", *OTHERS)),
                *(ratio(values.get(fw), d) for fw in OTHERS)]

    def growth_at(p: int) -> dict[str, Cell]:
        return {fw: c[p] / c[10] for fw, c in growth.items() if p in c}

    def per(p: int) -> dict[str, Cell]:
        return {fw: c.get(p) for fw, c in growth.items()}

    rows = [
        cells("cold start, one-shot run (ms)", "{:.1f}",
              {fw: cold[fw][0] for fw in ("dsh", *OTHERS) if fw in cold}),
        cells(f"CPU per step, N={n} (us; dsh fsync=step)", "{:.1f}", step_cpu),
        cells(f"CPU per step at k={k_other:,} (us)", "{:.1f}", per(k_other)),
        cells(f"step-cost growth, k={k_other:,} / k=10", "{:.2f}", growth_at(k_other)),
    ]
    if k != k_other:
        rows.append(cells(f"step-cost growth, k={k:,} / k=10", "{:.2f}", growth_at(k)))
    rows += [
        cells("peak RSS, one-shot run (MiB)", "{:.1f}", rss_one),
        cells(f"peak RSS, {n}-step run (MiB)", "{:.1f}", rss_steps),
    ]
    table("Summary", ["figure", "dsh", "llm", "pydantic-ai", "llm / dsh", "pydantic-ai / dsh"],
          rows, notes({**loop_na, **capped}))


if __name__ == "__main__":
    main()
