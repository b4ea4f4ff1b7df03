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
import re
import sys
import types
from collections.abc import Iterable
from typing import Any

import attrs
import pluggy

from dsh import hookspecs
from dsh.core.errors import ConfigError
from dsh.core.errors import DshError
from dsh.core.errors import PluginError

#: Built-in subsystems, registered under these names in every manager. ``module:attr`` names
#: an object (a class instantiated with the manager) instead of a module.
#:
#: The order of the last three is the order of the framework's layers in the chat and tool
#: chains (D3): they are ``trylast`` wrappers, and pluggy runs a later-registered ``trylast``
#: wrapper *inside* an earlier one. Registered budget → hook dispatch → recorder, the chains
#: read plugin wrappers → dsh.budget → [dsh.tools:HookDispatch] → dsh.recorder → core
#: (tests/test_c3_transport.py observes it). An unobserved run's steps call the chains without
#: the recorder, and without the hook dispatch while no plugin implements ``pre_execute`` or
#: ``post_execute``: there both would only yield (``dsh.tools.dispatch.lean_hook``).
BUILTIN_MODULES: dict[str, str] = {
    "dsh.loop": "dsh.run.loop",
    "dsh.llm.builtin": "dsh.llm.builtin",
    "dsh.tools": "dsh.tools.registry",
    "dsh.prompt": "dsh.run.prompt",
    "dsh.ledger": "dsh.ledger.store",
    "dsh.scope": "dsh.host.scope",
    "dsh.compaction": "dsh.run.compaction",
    "dsh.schema": "dsh.llm.schema",
    "dsh.memory": "dsh.run.memory",
    "dsh.tasks": "dsh.run.tasks",
    "dsh.budget": "dsh.run.budget",
    "dsh.tools:HookDispatch": "dsh.tools.registry:HookDispatch",
    "dsh.recorder": "dsh.run.recorder",
}
#: The built-ins' registered names, in registration order. The names are stable (configs say
#: ``disable = ["dsh.prompt"]``); where each lives is :data:`BUILTIN_MODULES`' business.
BUILTIN_PLUGINS: tuple[str, ...] = tuple(BUILTIN_MODULES)
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
    #: Warnings already issued about this plugin (each is issued once per app).
    warned: set[str] = attrs.field(factory=set, repr=False, eq=False)

    def _read_meta(self) -> tuple[str, str]:
        if self._meta is None:
            d = self.distribution
            if d is None:
                self._meta = ("", "")
            elif isinstance(d, str):  # a *.dist-info / *.egg-info directory
                self._meta = _read_name_version(d)
            else:  # an importlib.metadata.Distribution
                self._meta = (d.metadata["Name"] or "", d.version or "")
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


def entry_points(group: str) -> list[tuple[str, str, Any]]:
    """``(name, "module:attr", distribution)`` of every entry point in ``group``.

    Reads ``*.dist-info/entry_points.txt`` (and ``*.egg-info``) of the directories on
    ``sys.path`` directly, in path order, the first distribution of a name winning — what
    ``importlib.metadata.entry_points`` does for installed and editable distributions, but
    without importing it: that import alone costs more than a bare interpreter's start-up,
    and start-up is import cost. A zip file on ``sys.path`` falls back to importlib.metadata.
    """
    if any(os.path.isfile(p) for p in sys.path if p):
        from importlib.metadata import entry_points as ep_scan

        return [(ep.name, ep.value, ep.dist) for ep in ep_scan(group=group)]
    found: list[tuple[str, str, Any]] = []
    seen: set[str] = set()
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for n in names:
            if not n.endswith((".dist-info", ".egg-info")):
                continue
            dist_key = n.partition("-")[0].lower().replace("_", "-").replace(".", "-")
            if dist_key in seen:
                continue
            seen.add(dist_key)
            path = os.path.join(entry or ".", n)
            try:
                with open(os.path.join(path, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            found.extend((name, value, path) for name, value in _section(text, group))
    return found


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """``name = value`` pairs of the ``[group]`` section of an entry_points.txt."""
    pairs: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            inside = line == f"[{group}]"
        elif inside and "=" in line:
            name, _, value = line.partition("=")
            pairs.append((name.strip(), value.strip()))
    return pairs


def load_object(value: str) -> Any:
    """Import ``"module:attr.sub"`` (an entry point's value)."""
    module_name, _, attr = value.partition(":")
    obj: Any = importlib.import_module(module_name.strip())
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj


def _read_name_version(path: str) -> tuple[str, str]:
    """Name and Version from a dist-info's METADATA (or an egg-info's PKG-INFO) headers."""
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, filename), encoding="utf-8") as f:
                meta: dict[str, str] = {}
                for line in f:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    key, _, value = line.partition(":")
                    if key in ("Name", "Version") and key not in meta:
                        meta[key] = value.strip()
                return meta.get("Name", ""), meta.get("Version", "")
        except OSError:
            continue
    return "", ""


def _allowlist() -> set[str] | None:
    """``$DSH_LOAD_PLUGINS`` as a set of entry-point names, or ``None`` when it is unset."""
    raw = os.environ.get("DSH_LOAD_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def discover(autoload: bool = True, load: Iterable[str] = (), strict: bool = False,
             disable: Iterable[str] = (), where: str = "config") -> list[PluginRecord]:
    """Import installed plugins (entry points, unless ``autoload`` is false or the
    ``DSH_LOAD_PLUGINS`` allow list excludes them) and the ``load`` modules.

    A name in ``DSH_LOAD_PLUGINS`` that is no installed plugin, or in ``disable`` that is no
    built-in, installed or ``load`` plugin, is a :class:`ConfigError` (a typo would otherwise
    load or block nothing without a word); ``where`` names the config in that message.
    """
    records: list[PluginRecord] = []
    allow = _allowlist()
    load = list(load)
    disable = list(disable)
    unsure = [n for n in disable if n not in BUILTIN_PLUGINS and n not in load]
    installed = entry_points(ENTRY_POINT_GROUP) if autoload or allow or unsure else []
    _check_names(allow, unsure, [name for name, _, _ in installed], load, where)
    if autoload:
        seen: set[str] = set()
        for name, value, dist in installed:
            if name in seen or (allow is not None and name not in allow):
                continue
            seen.add(name)
            rec = PluginRecord(name, module=value, distribution=dist)
            try:
                rec.obj = load_object(value)
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
                if strict:
                    raise PluginError(
                        f"plugin {rec.label} failed to load: {rec.error}", plugin=name
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


def _check_names(allow: set[str] | None, disable: list[str], installed: list[str],
                 load: list[str], where: str) -> None:
    """Every name in ``DSH_LOAD_PLUGINS`` is installed; every name in ``disable`` is known."""
    from dsh.core.errors import unknown_name

    for name in sorted(allow or ()):
        if name not in installed:
            raise ConfigError("DSH_LOAD_PLUGINS: "
                              + unknown_name("plugin", name, sorted(set(installed)), "installed"))
    known = [*BUILTIN_PLUGINS, *sorted(set(installed)), *load]
    for name in disable:
        if name not in known:
            raise ConfigError(f"{where}: key 'disable': "
                              + unknown_name("plugin", name, known, "built-in and installed"))


class BuiltinHooks:
    """The hook implementations of a built-in module, as the object pluggy registers.

    pluggy inspects every name ``dir()`` gives of what it registers, and a subsystem module
    has dozens (its imports, classes, helpers): listing only the hook implementations makes
    building a plugin manager several times cheaper (about 1.5 ms less for each manager, at
    every start-up). The functions are the module's own.
    """

    def __init__(self, module: types.ModuleType) -> None:
        self.__module = module
        self.__names = [k for k, v in vars(module).items()
                        if callable(v) and hasattr(v, "dsh_impl")]
        for k in self.__names:
            setattr(self, k, getattr(module, k))

    @property
    def module(self) -> types.ModuleType:
        return self.__module

    def __dir__(self) -> list[str]:
        return list(self.__names)

    def __repr__(self) -> str:
        return f"<built-in plugin {self.__module.__name__}>"


_BUILTIN_HOOKS: dict[str, BuiltinHooks] = {}


def _builtin_object(name: str, pm: pluggy.PluginManager) -> Any:
    module_name, _, attr = BUILTIN_MODULES[name].partition(":")
    module = importlib.import_module(module_name)
    if attr:
        return getattr(module, attr)(pm)
    hooks = _BUILTIN_HOOKS.get(name)
    if hooks is None:
        hooks = _BUILTIN_HOOKS[name] = BuiltinHooks(module)
    return hooks


#: Hooks every run calls for one answer (``firstresult``), with no meaning for "nobody
#: answered": after assembly each must have an implementation, else the configuration is wrong
#: (say ``disable = ["dsh.loop"]`` with no replacement). Wrappers do not count.
ESSENTIAL_HOOKS: tuple[str, ...] = ("agent_plugins", "session_store", "run_turn", "request",
                                    "execute")


def make_plugin_manager(
    plugins: Iterable[PluginRecord] = (),
    disable: Iterable[str] = (),
    strict: bool = False,
    *,
    complete: bool = False,
    where: str = "config",
) -> pluggy.PluginManager:
    """A manager with every hookspec, the built-ins and ``plugins`` (already imported).

    Order: hookspecs → blocks → built-ins → plugins → ``check_pending``. A plugin whose
    registration fails gets ``error`` set on its record (or raises, when ``strict``). A hook
    implementation whose name matches no hook is a :class:`~dsh.errors.PluginWarning` (once
    per plugin record), or an error when ``strict``. With ``complete`` (an assembled app or
    agent), each of :data:`ESSENTIAL_HOOKS` must have an implementation: a
    :class:`ConfigError` naming ``where`` and the blocked plugin otherwise.
    """
    disable = list(disable)
    pm = pluggy.PluginManager("dsh")
    pm.add_hookspecs(hookspecs)
    for name in disable:
        if name in ESSENTIAL_PLUGINS:
            raise ConfigError(f"{where}: key 'disable': plugin {name} is essential and cannot "
                              "be disabled")
        pm.set_blocked(name)
    for name in BUILTIN_PLUGINS:
        if not pm.is_blocked(name):
            pm.register(_builtin_object(name, pm), name=name)
    notes: list[str] = []
    for rec in plugins:
        if rec.obj is None or pm.is_blocked(rec.name):
            continue
        try:
            pm.register(rec.obj, name=rec.name)
            for message in _check_pending(pm, rec, strict):
                if message not in rec.warned:
                    rec.warned.add(message)
                    notes.append(message)
        except Exception as exc:
            if pm.get_plugin(rec.name) is not None:
                pm.unregister(name=rec.name)
            rec.error = str(exc) if isinstance(exc, PluginError) else (
                f"{type(exc).__name__}: {exc}")
            if strict:
                raise PluginError(f"plugin {rec.label} failed to register: {rec.error}",
                                  plugin=rec.name) from exc
    if complete:
        _check_essential(pm, disable, where)
    if os.environ.get("DSH_TRACE_HOOKS"):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    if notes:
        import warnings

        from dsh.core.errors import PluginWarning

        for message in notes:  # after registration: a filter may turn a warning into an error
            warnings.warn(message, PluginWarning, stacklevel=2)
    return pm


def _check_pending(pm: pluggy.PluginManager, rec: PluginRecord, strict: bool) -> list[str]:
    """Warnings for the hook implementations of plugin ``rec`` that match no hookspec (a
    typo: pluggy would never call them); with ``strict``, the first is a PluginError. An
    implementation marked ``optionalhook=True`` is left alone, as pluggy does."""
    callers = dict(vars(pm.hook))
    known = sorted(h for h, c in callers.items() if c.spec is not None)
    messages = []
    for hook_name, caller in callers.items():
        if caller.spec is not None:
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin_name == rec.name and not impl.optionalhook:
                import difflib

                near = difflib.get_close_matches(hook_name, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                if strict:
                    raise PluginError(f"implements unknown hook {hook_name!r}{hint}",
                                      plugin=rec.name, hook=hook_name)
                messages.append(f"plugin {rec.label}: {hook_name!r} is not a dsh hook, so this "
                                f"implementation is never called{hint}")
    return messages


def _check_essential(pm: pluggy.PluginManager, disable: list[str], where: str) -> None:
    for hook in ESSENTIAL_HOOKS:
        impls = getattr(pm.hook, hook).get_hookimpls()
        if any(not (i.hookwrapper or i.wrapper) for i in impls):
            continue
        blocked = [n for n in disable if n in BUILTIN_PLUGINS and _builtin_implements(n, hook)]
        why = (f"{' and '.join(repr(b) for b in blocked)} is disabled (key 'disable') and no "
               "plugin here replaces it" if blocked else "no plugin provides it")
        raise ConfigError(f"{where}: no plugin implements the hook {hook!r}, which every run "
                          f"needs: {why}")


def _builtin_implements(name: str, hook: str) -> bool:
    """Whether built-in ``name`` has a non-wrapper implementation of ``hook``."""
    module_name, _, attr = BUILTIN_MODULES[name].partition(":")
    obj: Any = importlib.import_module(module_name)
    if attr:
        obj = getattr(obj, attr)
    opts = getattr(getattr(obj, hook, None), "dsh_impl", None)
    return bool(opts is not None and not (opts.get("wrapper") or opts.get("hookwrapper")))


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


_WRAPFAIL = re.compile(r"wrap_controller at '([^']*)' (.*):(\d+) (has second yield|did not yield)")


def wrapper_failure(pm: pluggy.PluginManager, exc: BaseException) -> PluginError | None:
    """pluggy's "wrap_controller at 'f' FILE:LINE has second yield" (or "did not yield") as a
    :class:`PluginError` naming the plugin and hook of that wrapper; ``None`` for any other
    error. A wrapper yields exactly once (D3: the inner layers run once, no double charge)."""
    if not isinstance(exc, RuntimeError):
        return None
    m = _WRAPFAIL.search(str(exc))
    if m is None:
        return None
    name, filename, line, what = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    for hook_name, impl, code in _impl_codes(pm):
        if code.co_name == name and code.co_filename == filename and code.co_firstlineno == line:
            verb = "yielded a second time" if what == "has second yield" else "did not yield"
            return PluginError(
                f"plugin {impl.plugin_name}: its {hook_name} wrapper {name}() {verb}; a "
                "wrapper must yield exactly once (the inner layers run once)",
                plugin=impl.plugin_name, hook=hook_name)
    return None


def _impl_codes(pm: pluggy.PluginManager) -> Iterable[tuple[str, Any, Any]]:
    """``(hook name, hookimpl, code object)`` of every implementation that has code."""
    for hook_name in dir(pm.hook):
        caller = getattr(pm.hook, hook_name, None)
        if caller is None or not hasattr(caller, "get_hookimpls"):
            continue
        for impl in caller.get_hookimpls():
            code = getattr(impl.function, "__code__", None)
            if code is not None:
                yield hook_name, impl, code


def plugin_of(pm: pluggy.PluginManager, exc: BaseException) -> tuple[str, str] | None:
    """``(plugin, hook)`` whose implementation raised ``exc``, found from the traceback.

    Costs nothing until an error happens: it maps code objects of hook implementations to their
    plugins only then.
    """
    codes: dict[Any, tuple[str, str]] = {
        code: (impl.plugin_name, hook_name) for hook_name, impl, code in _impl_codes(pm)
        if not impl.plugin_name.startswith("dsh.")}
    tb = exc.__traceback__
    found = None
    while tb is not None:
        hit = codes.get(tb.tb_frame.f_code)
        if hit and not _passed_through(tb):
            found = hit
        tb = tb.tb_next
    return found


def _passed_through(tb: Any) -> bool:
    """True when the exception was thrown into a wrapper at its ``yield`` (an inner layer
    raised, the wrapper did not catch it): that wrapper is not the one that failed."""
    code = tb.tb_frame.f_code
    if not code.co_flags & 0x20:  # inspect.CO_GENERATOR (inspect costs start-up time)
        return False
    import dis

    return any(i.offset == tb.tb_lasti and i.opname == "YIELD_VALUE"
               for i in dis.get_instructions(code))
