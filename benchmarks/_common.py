"""Helpers shared by the benchmark scripts (not a test: no assertions on timing)."""

from __future__ import annotations

import sys
import tempfile
import types
from typing import Any

from dsh.app import App
from dsh.config import config_from_dict
from dsh.hookspecs import hookimpl


def noop(x: int) -> int:
    """Return x."""
    return x


def bench_app(tmp: str, *, extra: Any = None, fsync: str = "step") -> App:
    """An app with one trivial tool, sessions on disk under ``tmp``."""
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
        "autoload": False, "load": ["dsh_bench_plugin"], "sessions_dir": tmp,
        "max_steps": 1_000_000, "fsync": fsync,
    }))


def tool_loop_script(steps: int) -> list[dict[str, Any]]:
    """``steps`` responses calling the tool once each, then a final answer."""
    call = {"tool_calls": [{"name": "noop", "arguments": {"x": 1}}]}
    return [call] * (steps - 1) + [{"text": "done"}]


def tmpdir() -> str:
    return tempfile.mkdtemp(prefix="dsh-bench-")
