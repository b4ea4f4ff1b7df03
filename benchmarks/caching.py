"""Anthropic prompt caching: input tokens billed at full price over a long tool loop.

    python benchmarks/caching.py [--steps 50] [--system-chars 8000] [--result-chars 2000]

A real ``dsh`` run (the Anthropic adapter, extended thinking on) against a loopback service
that implements the Messages API's published cache accounting (``tests.servers.AnthropicSim``:
the prompt is tools → system → messages; each ``cache_control`` breakpoint writes the prefix
that ends at its block; a request reads the longest cached prefix ending at a breakpoint or
up to 20 blocks before one; 1 token per 4 characters of a block's JSON; no minimum length).
The loop makes ``--steps`` model requests: each thinks, calls a tool whose result is
``--result-chars`` long, and the last answers. Run twice — ``cache = "auto"`` (dsh's
breakpoint policy) and ``cache = "off"`` — and prints for each: every input token, those billed
at full price (``input_tokens``), cache reads and writes, and the input cost in units of the
full input price (reads 0.1x, writes 1.25x, Anthropic's rates); then the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dsh.config.loader import config_from_dict  # noqa: E402
from dsh.hookspecs import hookimpl  # noqa: E402
from dsh.run.app import App  # noqa: E402
from tests.servers import AnthropicSim  # noqa: E402
from tests.servers import ScriptedServer  # noqa: E402

MODEL = "anthropic:claude-sonnet-4-5"


def loop(steps: int) -> list[list[tuple[Any, ...]]]:
    out: list[list[tuple[Any, ...]]] = [
        [("thinking", f"Step {i}: the next file to read is part{i}.txt. " * 3),
         ("text", f"Reading part {i}."),
         ("tool_use", f"toolu_{i:04d}", "read", {"path": f"part{i}.txt"})]
        for i in range(steps - 1)]
    out.append([("thinking", "Everything is read."), ("text", "Done.")])
    return out


def run(steps: int, cache: str, system_chars: int, result_chars: int) -> dict[str, int]:
    mod = types.ModuleType("dsh_caching_bench")

    @hookimpl
    def register_tools(register: Any) -> None:
        def read(path: str) -> str:
            """Read a file of the project."""
            return (f"# {path}\n" + "def f(x):\n    return x * 2  # doubled\n" * result_chars
                    )[:result_chars]

        register(read)

    mod.register_tools = register_tools  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    sim = AnthropicSim(loop(steps))
    with ScriptedServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.responder = sim
        app = App(config_from_dict({
            "autoload": False, "load": [mod.__name__], "sessions_dir": tmp, "model": MODEL,
            "max_steps": steps + 1,
            "agents": {"default": {"system": ("You are a meticulous code reviewer. "
                                              * system_chars)[:system_chars]}},
            "models": {MODEL: {"base_url": server.url, "api_key": "sk-ant-bench-0000000",
                               "retries": 0, "options": {"max_tokens": 8192, "thinking": 2048,
                                                         "cache": cache}}}}))
        result = app.run("Review every part of the project.")
    assert result.outcome == "completed" and result.steps == steps, result.reason
    assert not sim.errors, sim.errors
    full = sum(u["input_tokens"] for u in sim.usages)
    read = sum(u["cache_read_input_tokens"] for u in sim.usages)
    written = sum(u["cache_creation_input_tokens"] for u in sim.usages)
    assert result.usage.input_tokens == full + read + written  # dsh counted the same
    return {"requests": len(sim.usages), "all": full + read + written, "full": full,
            "read": read, "written": written,
            "cost": round(full + 0.1 * read + 1.25 * written)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--system-chars", type=int, default=8000)
    parser.add_argument("--result-chars", type=int, default=2000)
    args = parser.parse_args()
    rows = {mode: run(args.steps, mode, args.system_chars, args.result_chars)
            for mode in ("off", "auto")}
    print(f"{args.steps}-step tool loop, system prompt {args.system_chars} chars, tool results "
          f"{args.result_chars} chars, thinking on")
    print(f"{'cache':6} {'requests':>8} {'input tokens':>13} {'at full price':>14} "
          f"{'cache read':>11} {'cache write':>12} {'input cost*':>12}")
    for mode, r in rows.items():
        print(f"{mode:6} {r['requests']:>8} {r['all']:>13} {r['full']:>14} {r['read']:>11} "
              f"{r['written']:>12} {r['cost']:>12}")
    off, auto = rows["off"], rows["auto"]
    ratio = f"{off['full'] / auto['full']:.1f}x" if auto["full"] else "every token cached"
    print(f"input tokens billed at full price, off / auto: {off['full']} / {auto['full']} "
          f"({ratio}: with the moving breakpoint on the last message nothing is left after it)")
    dear = auto["full"] + auto["written"]
    print(f"input tokens billed at full price or more (+ cache writes at 1.25x), off / auto: "
          f"{off['full']} / {dear} = {off['full'] / max(1, dear):.1f}x")
    print(f"input cost (*in full-price input tokens: reads 0.1x, writes 1.25x), off / auto: "
          f"{off['cost']} / {auto['cost']} = {off['cost'] / max(1, auto['cost']):.1f}x")


if __name__ == "__main__":
    main()
