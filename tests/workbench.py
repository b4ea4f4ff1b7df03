"""Shared by the workbench's tests: an app whose agent ``a`` has dsh-shell's tools."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsh.run.app import App


def shell_apps(tmp_path: Path, ws: Path) -> Callable[..., App]:
    """``build(sandbox=…, **shell_settings)``: an app whose agent ``a`` has the shell tools
    on workspace ``ws``, with no terminal to ask on."""

    def build(sandbox: Any = None, **shell: Any) -> App:
        settings = {"workspace": str(ws), "tty": str(tmp_path / "no-terminal"), **shell}
        config: dict[str, Any] = {"sessions_dir": str(tmp_path / "sessions"),
                                  "plugins": {"shell": settings},
                                  "agents": {"a": {"plugins": ["shell"]}}}
        if sandbox is not None:
            config["sandbox"] = sandbox
        return App.from_config(config)

    return build


def patch_of(*lines: str) -> str:
    """A patch (Codex's format) of ``lines`` between the begin and end markers."""
    return "\n".join(("*** Begin Patch", *lines, "*** End Patch"))
