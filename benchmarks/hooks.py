"""What dsh-hooks costs: per tool call with a PreToolUse hook, and at start-up without hooks.

    python benchmarks/hooks.py [--runs 15] [--steps 60]

1. **Start-up.** CPU time (user + system, median) of ``dsh run -m echo hi`` (ledger
   written, no config) with every installed plugin, and with all but ``hooks``
   (``DSH_LOAD_PLUGINS``),
   interleaved; plus the import time of ``dsh_hooks`` alone (``-X importtime``).
2. **Per turn without hooks.** An in-process turn of ``--steps`` tool calls, with the plugin
   loaded (no hooks configured) and without it: the cost of its hook implementations.
3. **Per tool call with a PreToolUse hook.** The same turn with one PreToolUse hook (``cat >
   /dev/null``, matched on every tool), minus the turn without it, per call; beside a bare
   ``subprocess.run`` of the same command through the same shell with the same JSON input;
   and one hook through the engine alone against that bare ``subprocess.run``, best of many.

Start-up: medians; turns and spawns: best of ``--runs``. The machine is shared: compare
the columns of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from dsh.config.loader import config_from_dict
from dsh.hookspecs import hookimpl
from dsh.llm.builtin import ScriptedModel
from dsh.run.app import App

HOOK = "cat > /dev/null"


def dsh_command() -> list[str]:
    script = Path(sys.executable).with_name("dsh")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dsh"]


def startup(runs: int) -> tuple[float, float, float]:
    home = tempfile.mkdtemp(prefix="dsh-bench-hooks-")
    base = {**os.environ, "DSH_HOME": home, "XDG_CONFIG_HOME": home}
    base.pop("DSH_CONFIG", None)
    names = sorted({ep.name for ep in importlib.metadata.entry_points(group="dsh")})
    with_hooks = {**base, "DSH_LOAD_PLUGINS": ",".join(names)}
    without = {**base, "DSH_LOAD_PLUGINS": ",".join(n for n in names if n != "hooks")}
    cmd = [*dsh_command(), "run", "-m", "echo", "hi"]

    def timed(env: dict[str, str]) -> float:
        # CPU time (user + system) of the child: what the plugin could add, and what a
        # machine shared with other jobs disturbs far less than wall time.
        import resource

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    timed(with_hooks), timed(without)  # warm the page cache
    a, b = [], []
    for _ in range(runs):
        a.append(timed(with_hooks))
        b.append(timed(without))
    # "self" µs of dsh_hooks (best of --runs): its own module body; what it imports (dsh's
    # hookspecs and runcontext) is imported by every dsh start-up anyway.
    selfs = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c",
                              "import dsh.cli, dsh.app, dsh_hooks"],
                             capture_output=True, text=True, check=True).stderr
        selfs.append(sum(int(line.split(":")[1].split("|")[0]) for line in out.splitlines()
                         if line.rstrip().endswith(" dsh_hooks")))
    own = min(selfs)
    shutil.rmtree(home, ignore_errors=True)
    return statistics.median(a), statistics.median(b), own / 1e6


def noop(x: int) -> int:
    """Return x."""
    return x


def turn_time(steps: int, hooks: dict[str, Any] | None, load_plugin: bool, tmp: str,
              clock: Any = time.perf_counter) -> float:
    mod = types.ModuleType("dsh_bench_hooks_tool")

    @hookimpl
    def register_tools(register: Any) -> None:
        register(noop)

    mod.register_tools = register_tools  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    load = [mod.__name__] + (["dsh_hooks"] if load_plugin else [])
    cfg: dict[str, Any] = {"autoload": False, "load": load, "sessions_dir": tmp,
                           "max_steps": 1_000_000}
    if hooks is not None:
        cfg["plugins"] = {"hooks": {"hooks": hooks, "project_dir": tmp}}
    app = App(config_from_dict(cfg))
    agent = app.agent(model="echo")
    call = {"tool_calls": [{"name": "noop", "arguments": {"x": 1}}]}
    agent._model = ScriptedModel("", {"responses": [call] * steps + [{"text": "done"}]})
    t0 = clock()
    with app.open_session(agent) as s:
        result = s.send("go")
    elapsed = clock() - t0
    assert result.outcome == "completed", result.reason
    return elapsed


def bare_spawn(n: int, tmp: str) -> float:
    """``subprocess.run`` of the hook command, as dsh-hooks starts it (bash -c, JSON in)."""
    shell = shutil.which("bash") or "/bin/sh"
    payload = json.dumps({"session_id": "x", "transcript_path": "/tmp/x.jsonl", "cwd": tmp,
                          "hook_event_name": "PreToolUse", "tool_name": "noop",
                          "tool_input": {"x": 1}, "tool_use_id": "c1"}).encode()
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([shell, "-c", HOOK], input=payload, capture_output=True, cwd=tmp,
                       check=True)
    return (time.perf_counter() - t0) / n


def fire_vs_bare(n: int, tmp: str) -> tuple[float, float]:
    """Best of ``n``: one PreToolUse through the engine (payload built, process run, answer
    interpreted) and a bare ``subprocess.run`` of the same command, interleaved."""
    from dsh_hooks import config
    from dsh_hooks.engine import Engine

    raw = {"hooks": {"PreToolUse": [{"hooks": [{"type": "command", "command": HOOK}]}]}}
    eng = Engine(config.load(raw, "plugins.hooks", tmp), None, workspace=tmp)
    shell = shutil.which("bash") or "/bin/sh"
    payload = json.dumps(eng.base("PreToolUse")).encode()
    fired, bare = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        eng.fire("PreToolUse", {"tool_name": "Bash", "tool_input": {"command": "ls"}}, "Bash")
        fired.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run([shell, "-c", HOOK], input=payload, capture_output=True, cwd=tmp)
        bare.append(time.perf_counter() - t0)
    return min(fired), min(bare)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="start-ups per variant, and repeats")
    ap.add_argument("--steps", type=int, default=60, help="tool calls per measured turn")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dsh-bench-hooks-")
    with_p, without_p, imp = startup(args.runs)
    print(f"dsh run -m echo hi, plugin installed, no hooks: {with_p * 1e3:7.1f} ms CPU")
    print(f"dsh run -m echo hi, plugin not loaded:          {without_p * 1e3:7.1f} ms CPU  "
          f"(difference {(with_p - without_p) * 1e3:+.1f} ms)")
    print(f"import dsh_hooks (self, -X importtime):         {imp * 1e3:7.2f} ms")
    hook = {"PreToolUse": [{"matcher": "*", "hooks": [{"type": "command", "command": HOOK}]}]}
    # CPU time (process_time) for the turns without hooks: the plugin's cost there is CPU,
    # and CPU time is what a loaded machine disturbs least. Wall time where processes run.
    base, idle, base_wall, hooked, bare = [], [], [], [], []
    cpu = time.process_time
    for _ in range(args.runs):
        base.append(turn_time(args.steps, None, False, tmp, cpu))
        idle.append(turn_time(args.steps, None, True, tmp, cpu))
        base_wall.append(turn_time(args.steps, None, True, tmp))
        hooked.append(turn_time(args.steps, hook, True, tmp))
        bare.append(bare_spawn(args.steps, tmp))
    n = args.steps
    b, i, w, h, s = (min(x) for x in (base, idle, base_wall, hooked, bare))
    print(f"(best of {args.runs} turns of {n} tool calls each)")
    print(f"CPU per tool call, no plugin:                   {b / n * 1e6:9.1f} us")
    print(f"CPU per tool call, plugin loaded, no hooks:     {i / n * 1e6:9.1f} us "
          f"({(i - b) / n * 1e6:+.1f})")
    print(f"wall per tool call, plugin, no hooks:           {w / n * 1e6:9.1f} us")
    print(f"wall per tool call, one PreToolUse hook:        {h / n * 1e6:9.1f} us")
    print(f"  added per call by the hook:                    {(h - w) / n * 1e6:9.1f} us")
    print(f"  bare subprocess.run of the same command:       {s * 1e6:9.1f} us")
    print(f"  dsh-hooks' own overhead per call:              {((h - w) / n - s) * 1e6:9.1f} us")
    f, s2 = fire_vs_bare(args.steps * args.runs, tmp)
    print(f"one hook through the engine vs bare subprocess.run, best of {args.steps * args.runs}:"
          f" {f * 1e6:.0f} us vs {s2 * 1e6:.0f} us ({(f - s2) * 1e6:+.0f} us)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
