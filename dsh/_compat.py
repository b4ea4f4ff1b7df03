"""Old import paths, deprecated: they work for one more minor version (docs/api.md).

Before 0.3, dsh was one flat package: ``dsh.events``, ``dsh.app``, ``dsh.runcontext``… Those
modules now live in subsystem packages (docs/architecture.md). Plugins written against the old
paths keep working: importing ``dsh.events`` gives the very module object ``dsh.ledger.events``
(same classes, same globals: a monkeypatch through either name is one patch), through the
finder below, which :mod:`dsh` installs. It is consulted only for the names in :data:`MOVED`,
imports nothing until one is asked for, and costs ``dsh run`` nothing. Importing one issues
a :class:`DeprecationWarning` pointing at the importing line (once per process: the module is
then in ``sys.modules``); dsh itself imports none of them.

Old names that became packages (``dsh.ledger``, ``dsh.config``, ``dsh.tools``, ``dsh.batch``,
``dsh.cli``) keep their public names through a ``__getattr__`` in the package's ``__init__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

#: old module name → where it lives now.
MOVED: dict[str, str] = {
    "dsh.errors": "dsh.core.errors",
    "dsh.messages": "dsh.core.messages",
    "dsh.sanitize": "dsh.core.sanitize",
    "dsh.redact": "dsh.core.redact",
    "dsh.files": "dsh.core.files",
    "dsh.modeldata": "dsh.core.modeldata",
    "dsh.stash": "dsh.host.stash",
    "dsh.runcontext": "dsh.host.runcontext",
    "dsh.scope": "dsh.host.scope",
    "dsh.manager": "dsh.host.manager",
    "dsh.events": "dsh.ledger.events",
    "dsh.serialize": "dsh.ledger.serialize",
    "dsh.history": "dsh.ledger.history",
    "dsh.plugin_events": "dsh.ledger.plugin_events",
    "dsh.config_edit": "dsh.config.edit",
    "dsh.keys": "dsh.config.keys",
    "dsh.schema": "dsh.llm.schema",
    "dsh.attachments": "dsh.llm.attachments",
    "dsh.app": "dsh.run.app",
    "dsh.loop": "dsh.run.loop",
    "dsh.budget": "dsh.run.budget",
    "dsh.compaction": "dsh.run.compaction",
    "dsh.prompt": "dsh.run.prompt",
    "dsh.recorder": "dsh.run.recorder",
    "dsh.terminal": "dsh.cli.terminal",
    "dsh.render": "dsh.cli.render",
    "dsh.chat": "dsh.cli.repl",
    "dsh.commands": "dsh.cli.commands",
    "dsh.commands.sessions": "dsh.cli.commands.sessions",
    "dsh.commands.config": "dsh.cli.commands.config",
    "dsh.commands.chat": "dsh.cli.commands.chat",
    "dsh.commands.batch": "dsh.cli.commands.batch",
    "dsh.commands.inventory": "dsh.cli.commands.inventory",
    "dsh.commands.install": "dsh.cli.commands.install",
    "dsh.commands.keys": "dsh.cli.commands.keys",
}


class _Alias:  # an importlib Loader (importlib.abc is not imported: start-up is import cost)
    """Loads an old name as the module that lives at the new one."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import warnings

        warnings.warn(f"{spec.name} is deprecated and will be removed in the next minor "
                      "version: import the public names from dsh (docs/api.md); this module "
                      f"now lives at {self.target}, which is private", DeprecationWarning,
                      stacklevel=_importer_level())
        module = importlib.import_module(self.target)
        self.spec = module.__spec__  # the import system sets __spec__ to ours: put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec


def _importer_level() -> int:
    """The ``stacklevel`` of the line importing an old path: 2 (``warnings`` skips the import
    system's frozen frames itself), 3 through :func:`importlib.import_module`."""
    frame = sys._getframe(2)
    while frame is not None and "importlib._bootstrap" in frame.f_code.co_filename:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is not None and frame.f_code.co_filename == importlib.__file__:
        return 3
    return 2


class OldPaths:  # an importlib MetaPathFinder
    """The finder for :data:`MOVED` (first on ``sys.meta_path``; a dict lookup for others)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return ModuleSpec(fullname, _Alias(new))  # type: ignore[arg-type]


def install() -> None:
    if not any(isinstance(f, OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, OldPaths())


def package_getattr(package: str, old: str, submodules: frozenset[str]) -> Any:
    """A package's ``__getattr__`` for the names of the module it replaced (``dsh.ledger`` was
    a module; ``from dsh.ledger import JsonlStore`` still works, read from ``old``)."""

    def __getattr__(name: str) -> Any:
        if name in submodules or name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            return getattr(importlib.import_module(old), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
