"""Who is recording a plugin event or a state update: a plugin records only under its own name
(:mod:`dsh.ledger.plugin_events`; docs/security.md, "Plugin events").

This is the API's contract, not a sandbox: an in-process plugin is trusted code (it could
write the ledger file itself). It keeps a plugin from recording — by mistake or by a model's
doing — under another plugin's name.
"""

from __future__ import annotations

import re
import sys
import weakref
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from dsh.run.app import App

#: The namespace of the application embedding dsh (:data:`dsh.ledger.plugin_events.APP`).
APP = "app"


def _normal(name: str) -> str:
    """A distribution name compared as PyPI does (PEP 503): ``dsh_hooks`` is ``dsh-hooks``."""
    return re.sub(r"[-_.]+", "-", name).lower()



def is_installed(app: App, plugin: str, pm: Any = None) -> bool:
    """Whether ``plugin`` names a plugin of ``app`` (or of the agent plugin manager ``pm``):
    its registered name or its distribution's name; :data:`APP` always does."""
    if plugin == APP:
        return True
    for manager in (pm, app.pm):
        if manager is not None and manager.get_plugin(plugin) is not None:
            return True
    loaded = [r for r in app.plugins if r.obj is not None]
    if any(r.name == plugin or r.dist == plugin for r in loaded):
        return True
    # A distribution's plugin loaded by module (``load = ["dsh_hooks"]``): no entry point
    # tells its distribution; the installed packages' top-level modules do.
    modules = frozenset((r.module or getattr(r.obj, "__name__", "")).partition(".")[0]
                        for r in loaded)
    return _normal(plugin) in _module_dists(app, modules)


#: Per app: the distributions owning its plugins' top-level modules (reading them scans every
#: installed package, ~80 ms: once per app and set of loaded modules, not once per event).
_DISTS: weakref.WeakKeyDictionary[Any, tuple[frozenset[str], frozenset[str]]] = \
    weakref.WeakKeyDictionary()


def _module_dists(app: Any, modules: frozenset[str]) -> frozenset[str]:
    cached = _DISTS.get(app)
    if cached is not None and cached[0] == modules:
        return cached[1]
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    dists = frozenset(_normal(d) for m in modules for d in owners.get(m, ()))
    try:
        _DISTS[app] = (modules, dists)
    except TypeError:  # an app object that takes no weak reference: not cached
        pass
    return dists




#: Per plugin manager: the set of its plugins it was mapped for, and ``code -> plugin names``
#: of every hook implementation (rebuilt when a plugin is registered or unregistered).
_CODES: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], dict[Any, frozenset[str]]]] = \
    weakref.WeakKeyDictionary()


def _impl_codes(pm: Any) -> dict[Any, frozenset[str]]:
    registered = getattr(pm, "_name2plugin", None)  # pluggy's own table: cheap to compare
    key = tuple(registered.items()) if isinstance(registered, dict) else \
        tuple(pm.list_name_plugin())
    cached = _CODES.get(pm)
    if cached is not None and cached[0] == key:
        return cached[1]
    from dsh.host.manager import _impl_codes as impls

    codes: dict[Any, set[str]] = {}
    for _, impl, code in impls(pm):
        codes.setdefault(code, set()).add(impl.plugin_name)
    frozen = {code: frozenset(names) for code, names in codes.items()}
    try:
        _CODES[pm] = (key, frozen)
    except TypeError:  # a manager that takes no weak reference: not cached
        pass
    return frozen


def acting_plugin(app: App, pm: Any = None) -> frozenset[str] | None:
    """The plugin whose code is running on this thread: the registered name(s) of the
    innermost frame on the stack that is a hook implementation of ``pm`` or of ``app.pm``,
    or the plugin that registered the tool being called (a frame of
    :func:`dsh.tools.registry._call`). ``None`` when no plugin's code is on the stack:
    library code, the application embedding dsh.

    This is the API's contract, not a sandbox: an in-process plugin is trusted code (it could
    write the ledger file itself). It keeps a plugin from recording — by mistake or by a
    model's doing — under another plugin's name through :func:`record_event`,
    ``Session.record_event``, ``AgentHandle.record_event`` or ``StateKey.update``."""
    maps = [_impl_codes(m) for m in (pm, getattr(app, "pm", None)) if m is not None]
    registry = sys.modules.get("dsh.tools.registry")
    tool_code = registry._call.__code__ if registry is not None else None
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code is tool_code:
            tool = frame.f_locals.get("tool_")
            owner = getattr(tool, "plugin", "")
            return frozenset({owner}) if owner else None
        for codes in maps:
            names = codes.get(code)
            if names is not None:
                return names
        frame = frame.f_back
    return None


def owner_problem(app: App, pm: Any, plugin: str, event: str) -> str | None:
    """Why the plugin whose code is running (:func:`acting_plugin`) may not record
    ``event`` under ``plugin``; ``None`` when it may: ``plugin`` is its registered name or
    its distribution's, or no plugin's code is running (library code may write for any
    plugin of the app)."""
    acting = acting_plugin(app, pm)
    if acting is None or plugin in acting:
        return None
    wanted = _normal(plugin)
    for r in app.plugins:
        if r.name in acting and r.obj is not None and r.dist and _normal(r.dist) == wanted:
            return None
    # A distribution's plugin loaded by module (``load = ["dsh_hooks"]``): the distribution
    # owning its top-level module (the same answer is_installed gives).
    managers = [m for m in (pm, getattr(app, "pm", None)) if m is not None]
    for name in acting:
        obj = next((m.get_plugin(name) for m in managers if m.get_plugin(name) is not None),
                   None)
        module = obj.__name__ if isinstance(obj, ModuleType) else type(obj).__module__
        top = module.partition(".")[0] if isinstance(module, str) else ""
        if top and top != "dsh" and wanted in _dists_of(app, top):
            return None
    mine = " or ".join(repr(n) for n in sorted(acting))
    return (f"{event}: refused: it is recorded by plugin {mine}, and a plugin records events "
            f"only under its own name ({mine}, or its distribution's), not another plugin's "
            f"({plugin!r})")


#: Per app: ``top-level module -> the distributions owning it`` (normalised), as asked.
_OWNED: weakref.WeakKeyDictionary[Any, dict[str, frozenset[str]]] = weakref.WeakKeyDictionary()


def _dists_of(app: Any, top: str) -> frozenset[str]:
    try:
        known = _OWNED.setdefault(app, {})
    except TypeError:  # an app object that takes no weak reference: not cached
        known = {}
    if top not in known:
        from importlib.metadata import packages_distributions

        known[top] = frozenset(_normal(d) for d in packages_distributions().get(top, ()))
    return known[top]


