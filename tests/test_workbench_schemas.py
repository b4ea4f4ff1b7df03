"""The workbench's schemas stay short, their token costs in plugins/dsh-shell/README.md match
the code, and an agent enables the tools one by one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsh.run.app import App
from dsh.run.compaction.estimate import estimate_tokens

pytest.importorskip("dsh_shell")

README = Path(__file__).resolve().parents[1] / "plugins" / "dsh-shell" / "README.md"
#: No tool's schema may cost more than this: the model pays for every tool on every request.
MAX_TOKENS = 450


def _costs(tmp_path: Path, tools: list[str] | None = None) -> dict[str, int]:
    agent = {"plugins": ["shell"], **({"tools": tools} if tools is not None else {})}
    app = App.from_config({"sessions_dir": str(tmp_path / "s"),
                           "plugins": {"shell": {"workspace": str(tmp_path)}},
                           "agents": {"a": agent}})
    return {name: estimate_tokens(json.dumps({"name": name, "description": t.description,
                                              "parameters": t.parameters}))
            for name, t in app.agent("a").tools.items()}


def _documented() -> dict[str, int]:
    rows = re.findall(r"^\| `(\w+)\(.*?\| (\d+) \|$", README.read_text(), flags=re.M)
    return {name: int(tokens) for name, tokens in rows}


def test_the_readme_lists_every_tool_with_its_token_cost(tmp_path: Path) -> None:
    costs = _costs(tmp_path)
    documented = _documented()
    assert set(documented) == set(costs), "README.md's table lists exactly the tools"
    for name, tokens in costs.items():
        # The description of run_command names the machine's sandbox backend: a few tokens
        # either way; anything more is a schema that changed without its README line.
        assert abs(tokens - documented[name]) <= max(25, documented[name] // 10), (
            f"{name}: README.md says {documented[name]} tokens, the schema costs {tokens}")
        assert tokens <= MAX_TOKENS, f"{name}'s schema costs {tokens} tokens"


def test_an_agent_enables_the_tools_one_by_one(tmp_path: Path) -> None:
    chosen = ["read_file", "edit_file", "grep", "run_command"]
    assert set(_costs(tmp_path, chosen)) == set(chosen)
    assert set(_costs(tmp_path, ["glob"])) == {"glob"}
