"""Plugin managers: the built-ins, discovery through the ``dsh`` entry-point group, blocking.

There is no module-global manager. :func:`discover` finds and imports installed plugins once
per app; :func:`make_plugin_manager` builds a manager from built-ins plus a chosen subset of
them — the app-wide manager gets every installed plugin, each agent's manager only its own
(MISSION A6). A plugin that fails to import or register is reported with its name and
distribution and does not stop the others, unless ``strict_plugins`` is set.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from typing import Any

import attrs
import pluggy

from dsh import hookspecs
from dsh.errors import ConfigError
from dsh.errors import DshError
from dsh.errors import PluginError

#: Built-in subsystems, registered under these names in every manager. ``module:attr`` names
#: an object (a class instantiated with the manager) instead of a module.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "dsh.loop",
    "dsh.llm.builtin",
    "dsh.tools",
    "dsh.tools:HookDispatch",
    "dsh.prompt",
    "dsh.ledger",
    "dsh.scope",
    "dsh.recorder",
    "dsh.budget",
)
#: Cannot be blocked: budgets must hold whatever the configuration says.
ESSENTIAL_PLUGINS: tuple[str, ...] = ("dsh.budget",)
ENTRY_POINT_GROUP = "dsh"


@attrs.define
class PluginRecord:
    """An installed plugin: its name, where it came from, and whether it loaded.

    ``dist`` and ``version`` are read from the distribution's metadata on first use only:
    parsing METADATA (an email-format file) costs more at start-up than the plugin itself.
    """

    name: str
    module: str = ""
    obj: Any = None
    error: str | None = None
    distribution: Any = attrs.field(default=None, repr=False)
    _meta: tuple[str, str] | None = attrs.field(default=None, repr=False)

    def _read_meta(self) -> tuple[str, str]:
        if self._meta is None:
            d = self.distribution
            self._meta = (d.metadata["Name"] or "", d.version or "") if d is not None else ("", "")
        return self._meta

    @property
    def dist(self) -> str:
        return self._read_meta()[0]

    @property
    def version(self) -> str:
        return self._read_meta()[1]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.dist} {self.version})" if self.dist else self.name


def _allowlist() -> set[str] | None:
    raw = os.environ.get("DSH_LOAD_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def discover(autoload: bool = True, load: Iterable[str] = (), strict: bool = False,
             ) -> list[PluginRecord]:
    """Import installed plugins (entry points, unless ``autoload`` is false or the
    ``DSH_LOAD_PLUGINS`` allow list excludes them) and the ``load`` modules."""
    records: list[PluginRecord] = []
    allow = _allowlist()
    if autoload:
        from importlib.metadata import entry_points

        seen: set[str] = set()
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in seen or (allow is not None and ep.name not in allow):
                continue
            seen.add(ep.name)
            rec = PluginRecord(ep.name, module=ep.value, distribution=ep.dist)
            try:
                rec.obj = ep.load()
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
                if strict:
                    raise PluginError(
                        f"plugin {rec.label} failed to load: {rec.error}", plugin=ep.name
                    ) from exc
            records.append(rec)
    for dotted in load:
        rec = PluginRecord(dotted, module=dotted)
        try:
            rec.obj = importlib.import_module(dotted)
        except Exception as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(f"plugin {dotted} failed to load: {rec.error}",
                                  plugin=dotted) from exc
        records.append(rec)
    return records


def _builtin_object(name: str, pm: pluggy.PluginManager) -> Any:
    module_name, _, attr = name.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)(pm) if attr else module


def make_plugin_manager(
    plugins: Iterable[PluginRecord] = (),
    disable: Iterable[str] = (),
    strict: bool = False,
) -> pluggy.PluginManager:
    """A manager with every hookspec, the built-ins and ``plugins`` (already imported).

    Order: hookspecs → blocks → built-ins → plugins → ``check_pending``. A plugin whose
    registration fails gets ``error`` set on its record (or raises, when ``strict``).
    """
    pm = pluggy.PluginManager("dsh")
    pm.add_hookspecs(hookspecs)
    for name in disable:
        if name in ESSENTIAL_PLUGINS:
            raise ConfigError(f"plugin {name} is essential and cannot be disabled")
        pm.set_blocked(name)
    for name in BUILTIN_PLUGINS:
        if not pm.is_blocked(name):
            pm.register(_builtin_object(name, pm), name=name)
    for rec in plugins:
        if rec.obj is None or pm.is_blocked(rec.name):
            continue
        try:
            pm.register(rec.obj, name=rec.name)
            _check_pending(pm, rec.name)
        except Exception as exc:
            if pm.get_plugin(rec.name) is not None:
                pm.unregister(name=rec.name)
            rec.error = str(exc) if isinstance(exc, PluginError) else (
                f"{type(exc).__name__}: {exc}")
            if strict:
                raise PluginError(f"plugin {rec.label} failed to register: {rec.error}",
                                  plugin=rec.name) from exc
    if os.environ.get("DSH_TRACE_HOOKS"):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    return pm


def _check_pending(pm: pluggy.PluginManager, name: str) -> None:
    """Fail for a hook implementation of plugin ``name`` that matches no hookspec (a typo)."""
    callers = dict(vars(pm.hook))
    for hook_name, caller in callers.items():
        if caller.spec is not None:
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin_name == name and not impl.optionalhook:
                known = [h for h, c in callers.items() if c.spec is not None]
                import difflib

                near = difflib.get_close_matches(hook_name, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise PluginError(f"implements unknown hook {hook_name!r}{hint}",
                                  plugin=name, hook=hook_name)


def call_impl(impl: Any, hook: str, **kwargs: Any) -> Any:
    """Call one hook implementation directly (to keep provenance), passing the arguments it
    names; an unexpected exception becomes a :class:`PluginError` naming plugin and hook (a
    deliberate :class:`DshError`, such as a plugin's ConfigError, passes through)."""
    try:
        return impl.function(*[kwargs[a] for a in impl.argnames])
    except DshError:
        raise
    except Exception as exc:
        raise PluginError(
            f"plugin {impl.plugin_name} raised in hook {hook}: {type(exc).__name__}: {exc}",
            plugin=impl.plugin_name, hook=hook,
        ) from exc


def plugin_of(pm: pluggy.PluginManager, exc: BaseException) -> tuple[str, str] | None:
    """``(plugin, hook)`` whose implementation raised ``exc``, found from the traceback.

    Costs nothing until an error happens: it maps code objects of hook implementations to their
    plugins only then.
    """
    codes: dict[Any, tuple[str, str]] = {}
    for hook_name in dir(pm.hook):
        caller = getattr(pm.hook, hook_name, None)
        if caller is None or not hasattr(caller, "get_hookimpls"):
            continue
        for impl in caller.get_hookimpls():
            code = getattr(impl.function, "__code__", None)
            if code is not None and not impl.plugin_name.startswith("dsh."):
                codes[code] = (impl.plugin_name, hook_name)
    tb = exc.__traceback__
    found = None
    while tb is not None:
        hit = codes.get(tb.tb_frame.f_code)
        if hit:
            found = hit
        tb = tb.tb_next
    return found
