"""Helpers shared by the benchmark scripts (not a test: no assertions on timing)."""

from __future__ import annotations

import sys
import tempfile
import types
from typing import Any

from dsh.config.loader import config_from_dict
from dsh.hookspecs import hookimpl
from dsh.run.app import App


def noop(x: int) -> int:
    """Return x."""
    return x


def bench_app(tmp: str, *, extra: Any = None, fsync: str = "step",
              plugins: Any = None, autoload: bool = False, load: tuple[str, ...] = ()) -> App:
    """An app with one trivial tool, sessions on disk under ``tmp``; with ``autoload``, every
    installed plugin is loaded too (as ``dsh run`` does without a config)."""
    mod = types.ModuleType("dsh_bench_plugin")

    @hookimpl
    def register_tools(register: Any) -> None:
        register(noop)

    mod.register_tools = register_tools  # type: ignore[attr-defined]
    if extra is not None:
        for k, v in extra.items():
            setattr(mod, k, v)
    sys.modules["dsh_bench_plugin"] = mod
    return App(config_from_dict({
        "autoload": autoload, "load": ["dsh_bench_plugin", *load], "sessions_dir": tmp,
        "max_steps": 1_000_000, "fsync": fsync, "plugins": plugins or {},
    }))


def tool_loop_script(steps: int) -> list[dict[str, Any]]:
    """``steps`` responses calling the tool once each, then a final answer."""
    call = {"tool_calls": [{"name": "noop", "arguments": {"x": 1}}]}
    return [call] * (steps - 1) + [{"text": "done"}]


def tmpdir() -> str:
    return tempfile.mkdtemp(prefix="dsh-bench-")


def step_marks(steps: int) -> list[float]:
    """``time.process_time()`` at the start of every step of one dsh turn of ``steps``
    tool-calling steps (ledger on disk, default fsync): the raw data of growth figures."""
    import gc
    import time

    from dsh.llm.builtin import ScriptedModel

    marks: list[float] = []

    @hookimpl
    def pre_step(step: Any) -> None:
        marks.append(time.process_time())

    app = bench_app(tmpdir(), extra={"pre_step": pre_step})
    agent = app.agent(model="echo")
    agent._model = ScriptedModel("", {"responses": tool_loop_script(steps)})
    gc.collect()
    with app.open_session(agent) as s:
        result = s.send("go")
    assert result.outcome == "completed" and result.steps == steps, result.reason
    return marks

