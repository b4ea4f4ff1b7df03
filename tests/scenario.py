"""One scripted run with a tool loop, a sub-agent and a compaction (issue 28), run by the real
``dsh`` in a subprocess: the session the HTML export and the OpenTelemetry tests look at.

``lead`` calls the ``read`` tool three times, asks its sub-agent ``helper`` (which reads once
and answers), reads twice more and answers. Each ``read`` returns 1500 characters, so with a
1000-token window and ``compaction = "mask"`` the history is compacted during the run. Every
response carries a usage, so token counts can be checked: :data:`LEAD_USAGE` and
:data:`HELPER_USAGE` (input, output) in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w

TOOLS = '''
from dsh import hookimpl

SIZE = {size}


@hookimpl
def register_tools(register):
    def read(n: int) -> str:
        """Read a chunk.

        :param n: which chunk
        """
        return {payload!r} + f" chunk {{n}}: " + "x" * SIZE

    register(read)
'''

# Input counts stay under a quarter of the window: a provider reporting that much makes dsh
# calibrate its estimate to the report (issue 26), and these made-up counts are far under what
# the history really holds, which would calibrate the compaction away.
LEAD_USAGE = [(100, 10), (150, 11), (180, 12), (200, 13), (210, 14), (230, 15), (240, 16)]
HELPER_USAGE = [(30, 3), (60, 4)]


def _r(usage: tuple[int, int], **reply: Any) -> dict[str, Any]:
    return {**reply, "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}


def lead_script(hostile: str = "") -> list[dict[str, Any]]:
    u = LEAD_USAGE
    return [
        _r(u[0], text=hostile, tool_calls=[{"name": "read", "arguments": {"n": 0}}]),
        _r(u[1], tool_calls=[{"name": "read", "arguments": {"n": 1}}]),
        _r(u[2], tool_calls=[{"name": "read", "arguments": {"n": 2}}]),
        _r(u[3], tool_calls=[{"name": "ask_helper", "arguments": {"prompt": "sum it up"}}]),
        _r(u[4], tool_calls=[{"name": "read", "arguments": {"n": 3}}]),
        _r(u[5], tool_calls=[{"name": "read", "arguments": {"n": 4}}]),
        _r(u[6], text=hostile + "all read"),
    ]


def helper_script() -> list[dict[str, Any]]:
    u = HELPER_USAGE
    return [_r(u[0], tool_calls=[{"name": "read", "arguments": {"n": 9}}]),
            _r(u[1], text="the helper's summary")]


def make(folder: Path, *, hostile: str = "", size: int = 1500,
         plugins: dict[str, Any] | None = None, autoload: bool = False) -> Path:
    """Write the config, scripts and tool module under ``folder``; return the config path.
    ``plugins``: ``[plugins.NAME]`` tables; ``autoload``: load installed plugins too (narrow
    them with ``DSH_LOAD_PLUGINS``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scenario_tools.py").write_text(TOOLS.format(size=size, payload=hostile))
    for name, script in (("lead", lead_script(hostile)), ("helper", helper_script())):
        (folder / f"{name}.json").write_text(json.dumps({"responses": script}))
    config: dict[str, Any] = {
        "autoload": autoload, "load": ["scenario_tools"], "agent": "lead",
        "sessions_dir": str(folder / "sessions"),
        "agents": {
            "lead": {"model": f"scripted:{folder / 'lead.json'}", "subagents": ["helper"],
                     "compaction": "mask", "context_window": 1000, "compact_at": 0.2},
            "helper": {"model": f"scripted:{folder / 'helper.json'}"},
        },
        "models": {f"scripted:{folder / n}.json": {"price": {"input": 3.0, "output": 15.0}}
                   for n in ("lead", "helper")},
    }
    if plugins:
        config["plugins"] = plugins
    path = folder / "dsh.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def env(folder: Path, **extra: str) -> dict[str, str]:
    """The environment for ``dsh`` on the scenario: the tool module importable, no keys."""
    base = {k: v for k, v in os.environ.items()
            if not (k.startswith("DSH_") or k.startswith("OTEL_") or k.endswith("_API_KEY"))}
    base.update(PYTHONPATH=str(folder), DSH_HOME=str(folder / "home"),
                XDG_CONFIG_HOME=str(folder / "xdg"), **extra)
    return base


def dsh(folder: Path, *args: str, timeout: float = 120,
        **extra: str) -> subprocess.CompletedProcess[str]:
    """``dsh --config FOLDER/dsh.toml ARGS`` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(folder / "dsh.toml"),
                           *args], capture_output=True, text=True, timeout=timeout,
                          env=env(folder, **extra), stdin=subprocess.DEVNULL)


def run(folder: Path, **extra: Any) -> str:
    """Run the scenario; return the lead session's id (checked: completed, compacted, with
    one sub-agent run)."""
    proc = dsh(folder, "run", "--json", "read everything", **extra)
    assert proc.returncode == 0, proc.stderr
    sid = json.loads(proc.stdout)["session"]
    ledger = (folder / "sessions" / f"{sid}.jsonl").read_text().splitlines()
    types = [json.loads(line)["type"] for line in ledger]
    assert "context/compacted" in types, types
    assert any(json.loads(line).get("child_session") for line in ledger)
    return str(sid)
