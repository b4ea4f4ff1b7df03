"""The configuration the tests start from: dsh.testing builds ``dsh_app`` from it."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def dsh_config() -> dict[str, Any]:
    """`writer` enables the plugin and keeps at most 2 notes; `chat` does not enable it.
    ``load`` registers the plugin whether or not it is installed (under its module name, which
    is its entry point's name too)."""
    return {
        "autoload": False,
        "load": ["dsh_notes"],
        "agent": "writer",
        "agents": {
            "writer": {"plugins": ["dsh_notes"],
                       "plugin_settings": {"dsh_notes": {"max_notes": 2}}},
            "chat": {"plugins": []},
        },
        "plugins": {"dsh_notes": {"heading": "Remember", "protected": ["secret*"]}},
    }


@pytest.fixture(autouse=True)
def _workspace(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs in a workspace of its own (count_words reads the working directory)."""
    workspace = tmp_path / "work"
    workspace.mkdir()
    monkeypatch.chdir(workspace)
