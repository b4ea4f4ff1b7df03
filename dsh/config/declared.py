"""Declared plugin settings: an attrs class per plugin, validated like dsh's own config.

A plugin returns the class of its ``[plugins.NAME]`` table from the ``declare_settings`` hook;
dsh validates that table, and each agent's ``[agents.A.plugin_settings.NAME]`` overlaid on it
key by key, with the config's own strict converter (:mod:`dsh.config.loader`): an unknown key
is refused with the nearest valid name, a wrong type names the key path and what was
expected. :func:`settings` (``dsh.settings``) returns the validated instance for an agent::

    @attrs.frozen
    class NotesSettings:
        max_notes: int = 50
        heading: str = "Notes"

    @dsh.hookimpl
    def declare_settings():
        return NotesSettings

    @dsh.hookimpl
    def register_tools(register, agent):
        limit = dsh.settings(NotesSettings, agent).max_notes

Validation runs when a plugin manager is configured (the app's, then each agent's own:
``App.pm``, ``dsh config validate``, every run), once per app and plugin, and again at the
first :func:`settings` of an agent (cached on the agent). cattrs is imported only when a
plugin declares a class.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from typing import Any
from typing import TypeVar

from dsh.core.errors import ConfigError
from dsh.core.errors import PluginError
from dsh.core.errors import did_you_mean
from dsh.host.stash import StashKey

T = TypeVar("T")

#: Each declared class → the registered name of the plugin that declared it (its table is
#: ``[plugins.NAME]``); filled when a plugin manager is configured.
_DECLARED: dict[type, str] = {}
#: The plugins whose tables an app has validated (so each agent's manager does not redo it).
_CHECKED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
#: One stash key per declared class: the validated instance, cached in the agent's stash.
_KEYS: dict[tuple[type, str], StashKey[Any]] = {}


def declared(pm: Any) -> dict[str, type]:
    """``{plugin name: class}`` of every ``declare_settings`` implementation in ``pm``; a
    plugin returning what is not an attrs class is a :class:`PluginError` naming it."""
    hook = getattr(pm.hook, "declare_settings", None)
    if hook is None:
        return {}
    from dsh.host.manager import call_impl

    out: dict[str, type] = {}
    for impl in hook.get_hookimpls():
        cls = call_impl(impl, "declare_settings")
        if cls is None:
            continue
        import attrs

        if not (isinstance(cls, type) and attrs.has(cls)):
            raise PluginError(f"plugin {impl.plugin_name}: declare_settings must return an attrs "
                              f"class (or None), not {cls!r}", plugin=impl.plugin_name,
                              hook="declare_settings")
        out[impl.plugin_name] = cls
        _DECLARED.setdefault(cls, impl.plugin_name)
    return out


def check_app(app: Any, pm: Any) -> None:
    """Validate the tables of every class declared in ``pm``: ``[plugins.NAME]`` and each
    agent's overlay. Called when ``pm`` is configured; a bad table raises
    :class:`ConfigError` naming the config file and the key."""
    classes = declared(pm)
    if not classes:
        return
    cfg = app.config
    done = _CHECKED.setdefault(app, set())
    where = cfg.source or "config"
    for plugin, cls in classes.items():
        if plugin in done:
            continue
        base = cfg.plugin_settings(plugin)
        structure(cls, base, where, f"plugins.{_dotted(plugin)}")
        for name in cfg.agent_names():
            own = cfg.agent_config(name).plugin_settings.get(plugin)
            if own:
                structure(cls, base, where, f"plugins.{_dotted(plugin)}", own,
                          f"agents.{_dotted(name)}.plugin_settings.{_dotted(plugin)}")
        done.add(plugin)


def structure(cls: type[T], table: Mapping[str, Any] | None, where: str, key: str,
              overlay: Mapping[str, Any] | None = None, overlay_key: str = "") -> T:
    """``cls`` built from ``table`` (overlaid key by key with ``overlay``), strictly: the
    errors name ``where`` and the key path (``key``, or ``overlay_key`` for a key the overlay
    sets)."""
    from dsh.core.messages import thaw

    for value, prefix in ((table, key), (overlay, overlay_key)):
        if value is not None and not isinstance(value, Mapping):
            from dsh.config.finite import toml_kind

            raise ConfigError(f"{where}: key {prefix!r}: expected a table, got "
                              f"{toml_kind(value)}")
    merged = dict(thaw(dict(table or {})))
    if not merged and not overlay:  # no table: the defaults, without importing cattrs
        try:
            return cls()
        except (TypeError, ValueError):
            pass  # a field without a default, a default its validator refuses: named below
    _check_keys(merged, cls, where, key)
    if overlay:
        _check_keys(dict(overlay), cls, where, overlay_key)
        merged.update(thaw(dict(overlay)))
    import cattrs

    try:
        return _converter().structure(merged, cls)
    except cattrs.BaseValidationError as exc:
        msgs = cattrs.transform_error(exc, path="", format_exception=_format_exception)
        raise ConfigError(f"{where}: " + "; ".join(
            _tidy(m, key, overlay_key if overlay else "", overlay or {}) for m in msgs)) from None
    except (TypeError, ValueError) as exc:  # the class's own __attrs_post_init__
        raise ConfigError(f"{where}: key {key!r}: {exc}") from None


#: A validator's message that names its field first (``"timeout: expected a positive
#: number, got -1"``): shown as the key ``PREFIX.timeout``.
_FIELD_MESSAGE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*): (.+)", re.S)
_MARK = "\x00"


def _format_exception(exc: BaseException, type_: Any) -> str:
    """The config's own phrases, and a class validator's message as it is (marked when it
    names its field first, so that :func:`_tidy` puts the field in the key path)."""
    from dsh.config.loader import _format_exception as config_phrase
    from dsh.config.loader import _WrongType

    if isinstance(exc, ValueError | TypeError) and not isinstance(exc, _WrongType) \
            and type(exc).__module__ != "cattrs.errors":
        text = str(exc)
        return _MARK + text if _FIELD_MESSAGE.fullmatch(text) else text
    return config_phrase(exc, type_)


_CONVERTER: list[Any] = []


def _converter() -> Any:
    """The config's strict converter, plus strict tuples (``tuple[str, ...]`` from a TOML
    array only: cattrs would make ``"ab"`` into ``("a", "b")``). Built once per process."""
    if not _CONVERTER:
        import typing

        from dsh.config.finite import toml_kind
        from dsh.config.loader import _make_converter
        from dsh.config.loader import _WrongType

        conv = _make_converter()  # a new one: its hooks structure fields with itself

        def is_tuple(tp: Any) -> bool:
            args = typing.get_args(tp)
            return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis

        def structure_tuple(value: Any, tp: Any) -> tuple[Any, ...]:
            if not isinstance(value, list | tuple):
                raise _WrongType(f"expected an array, got {toml_kind(value)}")
            item = typing.get_args(tp)[0]
            out = []
            for i, v in enumerate(value):
                try:
                    out.append(conv.structure(v, item))
                except _WrongType as exc:
                    raise _WrongType(f"item {i + 1}: {exc}") from None
            return tuple(out)

        conv.register_structure_hook_func(is_tuple, structure_tuple)
        _CONVERTER.append(conv)
    return _CONVERTER[0]


def _check_keys(data: Mapping[str, Any], cls: type, where: str, prefix: str) -> None:
    """Every key of ``data`` (and of nested tables of attrs classes) is a field of ``cls``:
    else the nearest valid name, as the config's own keys."""
    import attrs

    try:
        attrs.resolve_types(cls)  # annotations are strings under `from __future__ import …`
    except NameError as exc:
        raise PluginError(f"settings class {cls.__qualname__}: cannot resolve its field types "
                          f"({exc}); define the types it names at module level") from None
    fields = {f.name: f for f in attrs.fields(cls)}
    for name, value in data.items():
        if not isinstance(name, str):
            raise ConfigError(f"{where}: key {name!r} in {prefix}: keys must be strings")
        field = fields.get(name)
        if field is None:
            raise ConfigError(f"{where}: unknown key '{prefix}.{name}'"
                              f"{did_you_mean(name, fields, 'valid keys')}")
        tp = field.type
        if isinstance(tp, type) and attrs.has(tp) and isinstance(value, Mapping):
            _check_keys(value, tp, where, f"{prefix}.{name}")


def _tidy(msg: str, key: str, overlay_key: str, overlay: Mapping[str, Any]) -> str:
    """cattrs' ``expected … @ $.a.b`` as ``key 'plugins.NAME.a.b': expected …``."""
    m = re.match(r"(.*) @ \$?\.?(.*)$", msg)
    if not m:
        return f"key {key!r}: {msg}"
    path = re.sub(r"\['([^']*)'\]", r".\1", m.group(2)).lstrip(".")
    text = m.group(1)
    if text.startswith(_MARK):  # "field: problem" from the class's own validator
        field, _, text = text[len(_MARK):].partition(": ")
        path = f"{path}.{field}" if path else field
    top = path.partition(".")[0].partition("[")[0]
    prefix = overlay_key if overlay_key and top in overlay else key
    return f"key '{prefix}.{path}': {text}" if path else f"key {prefix!r}: {text}"


def _dotted(name: str) -> str:
    """A table name as TOML writes it in a dotted key (quoted when it has a dot)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


def settings(cls: type[T], agent: Any = None, *, plugin: str | None = None) -> T:
    """The validated instance of ``cls`` (a class a plugin returns from ``declare_settings``)
    for ``agent`` (an :class:`dsh.AgentHandle`; default: the current run's agent): its
    ``[plugins.NAME]`` table overlaid with ``[agents.AGENT.plugin_settings.NAME]``. Cached on
    the agent: the same object each call. Declare the class frozen (``@attrs.frozen``).

    :param plugin: the plugin whose table it is, when dsh has not seen the declaration yet
        (a class declared by no configured plugin manager).
    :raises dsh.ConfigError: the table does not fit the class (key path, expected type).
    :raises dsh.PluginError: ``cls`` was declared by no plugin and ``plugin`` is not given.
    :raises dsh.NoRunContext: without ``agent``, outside a run.
    """
    if agent is None:
        from dsh.host.runcontext import context

        agent = context().handle
    name = plugin or _DECLARED.get(cls)
    if name is None:
        raise PluginError(f"dsh.settings({getattr(cls, '__qualname__', cls)}): no plugin "
                          "declared this class with declare_settings (or its app is not built "
                          "yet); pass plugin='NAME'")
    stash_key = _KEYS.get((cls, name))
    if stash_key is None:
        stash_key = _KEYS.setdefault((cls, name), StashKey())
    cached = agent.stash.get(stash_key, None)
    if cached is not None:
        return cached
    own = agent.settings.get("plugin_settings", {}).get(name)
    value = structure(cls, agent.all_plugin_settings.get(name), "config",
                      f"plugins.{_dotted(name)}", own,
                      f"agents.{_dotted(agent.name)}.plugin_settings.{_dotted(name)}")
    return agent.stash.setdefault(stash_key, value)
