"""Assembly is cheap and done once (MISSION D1): the cost of assembling an app with 50 tools,
the first time in a process and then a second, identical app next to it.

    python benchmarks/assemble.py [--tools 50]

The first assembly pays for imports and the first conversions; the second shows what
assembling another app costs once the process is warm (no I/O, no schema work per run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_plugin(n: int) -> str:
    from dsh.hookspecs import hookimpl

    def tool_factory(i: int) -> Any:
        def fn(query: str, limit: int = 10, verbose: bool = False) -> str:
            """Look something up.

            :param query: what to look for
            :param limit: at most this many results
            """
            return query

        fn.__name__ = f"tool_{i}"
        return fn

    tools = [tool_factory(i) for i in range(n)]

    @hookimpl
    def register_tools(register: Any) -> None:
        for t in tools:
            register(t)

    mod = types.ModuleType("dsh_assemble_bench")
    mod.register_tools = register_tools  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    return mod.__name__


def assemble(plugin: str, tmp: str) -> float:
    t0 = time.perf_counter()
    from dsh.config.loader import config_from_dict
    from dsh.run.app import App

    app = App(config_from_dict({"autoload": False, "load": [plugin], "sessions_dir": tmp}))
    agent = app.agent(model="echo")
    agent.model.provider_tools(agent.tool_specs)  # what opening a session does, once
    elapsed = time.perf_counter() - t0
    assert len(agent.tools) == int(os.environ.get("DSH_BENCH_TOOLS", "50"))
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", type=int, default=50)
    args = ap.parse_args()
    os.environ["DSH_BENCH_TOOLS"] = str(args.tools)
    import tempfile

    tmp = tempfile.mkdtemp()
    t_import = time.perf_counter()
    plugin = make_plugin(args.tools)
    t_import = time.perf_counter() - t_import
    first = assemble(plugin, tmp)
    second = min(assemble(plugin, tmp) for _ in range(5))
    print(f"first app with {args.tools} tools (imports included): {first * 1e3:.2f} ms")
    print(f"second app with {args.tools} tools (best of 5):        {second * 1e3:.2f} ms")
    print(f"second / first: {second / first:.2f}")


if __name__ == "__main__":
    main()
