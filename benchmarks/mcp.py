"""dsh-mcp: what an MCP server costs a run that does not call it, and what dsh adds per call.

    python benchmarks/mcp.py [--runs 30] [--calls 200]

1. **Start-up** — ``dsh run -m echo hi`` as a subprocess, interleaved: with dsh-mcp installed
   and no server configured, vs one stdio server configured whose tool list is cached (it is
   not called, so no process starts). Medians and the median of the paired differences.
   Also in-process, more precisely: assembling an agent (``App(...).agent()``) with and
   without the cached server. Target: ≤ 5 ms added.
2. **Per call** — the same server (``mcp-server-time``'s ``get_current_time``; a separate
   process for each side), called ``--calls`` times in a row: by the SDK's own client
   (``ClientSession`` over ``stdio_client`` in ``asyncio.run``), and through dsh's tool chain
   (``execute`` hook: dispatch, pre/post hooks, whole-schema validation, the hop to the
   loop thread and back). Medians per call and their ratio. Target: ≤ 1.3x.
3. **Cold start** of the first call through dsh (spawn + initialize + call), reported.

Needs dsh-mcp and mcp-server-time installed (``.ci/run`` installs both).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's directory is sys.path[0], where this file (mcp.py) would hide
# the SDK's `mcp` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

SERVER = {"command": sys.executable,
          "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
TOOL = "get_current_time"
ARGS = {"timezone": "UTC"}


def dsh_command() -> list[str]:
    script = Path(sys.executable).with_name("dsh")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dsh"]


def write_toml(path: Path, servers: dict[str, Any], sessions: Path) -> None:
    import tomli_w

    path.write_text(tomli_w.dumps({"sessions_dir": str(sessions),
                                   "plugins": {"mcp": {"servers": servers}}}))


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def startup(runs: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="dsh-mcp-bench-"))
    env = {**os.environ, "DSH_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    env.pop("DSH_CONFIG", None)
    none, one = home / "none.toml", home / "one.toml"
    write_toml(none, {}, home / "sessions")
    write_toml(one, {"time": SERVER}, home / "sessions")
    subprocess.run([*dsh_command(), "--config", str(one), "mcp", "refresh"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    cmds = {name: [*dsh_command(), "--config", str(cfg), "run", "-m", "echo", "hi"]
            for name, cfg in (("none", none), ("cached", one))}
    for cmd in cmds.values():
        timed(cmd, env)
    times: dict[str, list[float]] = {"none": [], "cached": []}
    for _ in range(runs):
        for name, cmd in cmds.items():
            times[name].append(timed(cmd, env))
    diffs = [c - n for c, n in zip(times["cached"], times["none"], strict=True)]
    print("## start-up: `dsh run -m echo hi`, one cached stdio server configured, not called")
    print(f"- no server: median {statistics.median(times['none']) * 1000:.1f} ms")
    print(f"- cached server: median {statistics.median(times['cached']) * 1000:.1f} ms")
    print(f"- added (median of {runs} paired differences): "
          f"{statistics.median(diffs) * 1000:+.1f} ms")

    # In-process: assembling the agent, the part of start-up the plugin adds to.
    os.environ["DSH_HOME"] = str(home)
    from dsh.run.app import App

    def assemble(cfg: Path) -> float:
        t0 = time.perf_counter()
        App.from_config(cfg).agent()
        return time.perf_counter() - t0

    for cfg in (none, one):
        assemble(cfg)
    inproc: dict[str, list[float]] = {"none": [], "cached": []}
    for _ in range(runs * 5):
        inproc["none"].append(assemble(none))
        inproc["cached"].append(assemble(one))
    added = statistics.median(inproc["cached"]) - statistics.median(inproc["none"])
    print(f"- in-process assembly: {statistics.median(inproc['none']) * 1000:.2f} ms without, "
          f"{statistics.median(inproc['cached']) * 1000:.2f} ms with the cached server "
          f"(added {added * 1000:+.2f} ms)")


def dsh_caller() -> tuple[Any, Any]:
    """``(one, close)``: ``one()`` makes one call through dsh's tool chain and returns its
    time; the tool list is cached and the server stopped, so the first call is cold."""
    from dsh_mcp import client

    from dsh.core.messages import ToolCall
    from dsh.run.app import App
    from dsh.tools.registry import ToolInvocation

    home = Path(tempfile.mkdtemp(prefix="dsh-mcp-bench-"))
    os.environ["DSH_HOME"] = str(home)
    cfg = {"sessions_dir": str(home / "s"), "plugins": {"mcp": {"servers": {"time": SERVER}}}}
    agent = App.from_config(cfg).agent()  # lists the tools (starts the server once)
    client.shutdown()
    tool = agent.tools[f"mcp__time__{TOOL}"]

    def one() -> tuple[float, float]:
        inv = ToolInvocation(ToolCall(id="c", name=tool.name, arguments=ARGS), tool, dict(ARGS))
        t0, c0 = time.perf_counter(), time.process_time()
        out = agent.pm.hook.execute(call=inv)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert out.status == "ok", out.output
        return elapsed, cpu

    return one, client.shutdown


async def interleaved(n: int) -> tuple[float, float, list[tuple[float, float]],
                                       list[tuple[float, float]]]:
    """The SDK's client in this thread's loop and dsh's chain (its own loop thread), one call
    each in turn, so both see the same machine load. dsh's call blocks this loop while it
    runs; the SDK's session has nothing in flight then."""
    from mcp import ClientSession
    from mcp import StdioServerParameters
    from mcp import stdio_client

    one, close = dsh_caller()
    dsh_cold = one()[0]
    params = StdioServerParameters(command=SERVER["command"], args=SERVER["args"])
    t0 = time.perf_counter()
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool(TOOL, ARGS)
        sdk_cold = time.perf_counter() - t0
        sdk, through = [], []
        for i in range(n):
            if i % 2:  # alternate which goes first
                through.append(one())
            t1, c1 = time.perf_counter(), time.process_time()
            await session.call_tool(TOOL, ARGS)
            sdk.append((time.perf_counter() - t1, time.process_time() - c1))
            if not i % 2:
                through.append(one())
    close()
    return sdk_cold, dsh_cold, sdk, through


def per_call(calls: int) -> None:
    sdk_cold, dsh_cold, sdk, through = asyncio.run(interleaved(calls))
    s, d = (statistics.median(t for t, _ in sdk), statistics.median(t for t, _ in through))
    sc = statistics.mean(c for _, c in sdk)
    dc = statistics.mean(c for _, c in through)
    print(f"\n## per call: `{TOOL}` of mcp-server-time over stdio, {calls} calls each, "
          "interleaved")
    print(f"- SDK client directly: median {s * 1e6:.0f} us")
    print(f"- through dsh's tool chain: median {d * 1e6:.0f} us")
    print(f"- ratio: {d / s:.2f}x (added {(d - s) * 1e6:+.0f} us per call)")
    print(f"- client-side CPU per call (this process, all threads; mean): SDK {sc * 1e6:.0f} us, "
          f"dsh {dc * 1e6:.0f} us, ratio {dc / sc:.2f}x")
    print("\n## cold start (spawn + initialize + first call)")
    print(f"- SDK client: {sdk_cold * 1000:.0f} ms; through dsh: {dsh_cold * 1000:.0f} ms")
    from dsh_mcp.validation import make_validator

    schema = {"type": "object", "properties": {"timezone": {"type": "string"}},
              "required": ["timezone"]}
    check = make_validator(schema)
    check(ARGS)
    t0 = time.perf_counter()
    for _ in range(1000):
        check(ARGS)
    per = (time.perf_counter() - t0) / 1000
    version = importlib.metadata.version("jsonschema")
    print(f"- whole-schema validation (jsonschema {version}): "
          f"{per * 1e6:.0f} us per call")
    imports = {}
    for what in ("pass", "import jsonschema", "import mcp, mcp.client.stdio"):
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", what], check=True)
            runs.append(time.perf_counter() - t0)
        imports[what] = min(runs)
    print(f"- import on first use (best of 5, over a bare interpreter): jsonschema "
          f"{(imports['import jsonschema'] - imports['pass']) * 1000:.0f} ms, mcp client "
          f"{(imports['import mcp, mcp.client.stdio'] - imports['pass']) * 1000:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    startup(args.runs)
    per_call(args.calls)


if __name__ == "__main__":
    main()
