"""Configuration: TOML → attrs classes through a strict cattrs converter (docs/config.md).

Every error names the file, the key (and its line when it can be found) and what was
expected; an unknown key is rejected with the nearest valid name. cattrs is imported only when
a config file is actually read, so a run without one does not pay for it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh.config.finite import MAX_OPTION_DEPTH as MAX_OPTION_DEPTH  # re-exported
from dsh.config.finite import dotted as _dotted
from dsh.config.finite import json_problem as json_problem  # re-exported
from dsh.config.finite import options_error as options_error  # re-exported
from dsh.config.finite import toml_kind as _toml_kind
from dsh.core.errors import ConfigError
from dsh.core.errors import did_you_mean as did_you_mean  # re-exported
from dsh.core.errors import unknown_name as unknown_name  # re-exported
from dsh.host.runcontext import LIMIT_NAMES
from dsh.host.runcontext import Limits

FSYNC_CHOICES = ("event", "step", "never")
#: Options (``[agents.X] options``, ``[models.ID] options``, ``-o``) nested deeper are refused.
#: Keys of ``[models.ID]`` that dsh itself reads (an adapter validates the others).
MODEL_PRICE_KEYS = ("input", "output", "cache_read", "cache_write")
#: ``sandbox``: a policy name or a table; its content is checked at assembly (dsh.sandbox).
SandboxSetting = str | dict[str, Any] | None


@attrs.frozen(kw_only=True)
class AgentConfig:
    """``[agents.NAME]``."""

    model: str | None = None
    system: str | None = None
    #: Entry-point names of the plugins this agent uses; ``None`` means every installed one.
    plugins: list[str] | None = None
    #: Allow list of tool names; ``None`` means every tool of its plugins.
    tools: list[str] | None = None
    max_steps: int | None = None
    options: dict[str, Any] = attrs.field(factory=dict)
    #: Per-agent overrides of ``[plugins.NAME]`` settings.
    plugin_settings: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: Budget limits of each run of this agent (over the top-level ``limits``).
    limits: Limits | None = None
    #: Other agents this agent may call as tools (``ask_NAME``), each in a child run.
    subagents: list[str] = attrs.field(factory=list)
    #: What the agent is for: the description of its ``ask_NAME`` tool.
    description: str | None = None
    #: Context compaction of this agent's sessions (over the top-level settings).
    compaction: str | None = None
    compact_at: float | None = None
    context_window: int | None = None
    summary_model: str | None = None
    sandbox: SandboxSetting = None  #: over ``[sandbox]``: a policy name or a table
    #: The permission mode of its runs (``ask`` when unset; docs/security.md).
    mode: str | None = None


@attrs.frozen(kw_only=True)
class Config:
    """The whole configuration. ``source`` is the file it came from (not a TOML key)."""

    #: The model of agents that set none; ``None``: chosen by :attr:`dsh.App.default_model`
    #: (a provider whose key is in the environment, a local model, else ``echo``).
    model: str | None = None
    agent: str = "default"
    agents: dict[str, AgentConfig] = attrs.field(factory=dict)
    #: ``[plugins.NAME]``: settings handed to that plugin.
    plugins: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: ``[models.ID]``: per-model settings (base_url, api_key_env, options, …).
    models: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: Plugin names to block: built-ins (``dsh.prompt``) or installed plugins.
    disable: list[str] = attrs.field(factory=list)
    #: Load installed plugins through their entry points.
    autoload: bool = True
    #: Extra plugin modules to import and register, by dotted name.
    load: list[str] = attrs.field(factory=list)
    #: A plugin that fails to load is fatal instead of a warning.
    strict_plugins: bool = False
    max_steps: int = 20
    max_continuations: int = 3
    #: How long sessions are kept within the model's window: ``auto`` (mask old tool outputs,
    #: then summarise), ``mask``, ``summarize`` or ``off`` (docs/config.md, "Compaction").
    compaction: str = "auto"
    #: Compact before a request estimated above this fraction of the context window.
    compact_at: float = 0.8
    #: The model's context window in tokens, when neither the model settings nor the table know.
    context_window: int | None = None
    #: The model that writes summaries (default: the agent's own).
    summary_model: str | None = None
    #: Budget limits of every run (``[limits]``: requests, steps, tool_calls, input_tokens,
    #: output_tokens, total_tokens, cost, seconds).
    limits: Limits = attrs.field(factory=Limits)
    sandbox: SandboxSetting = None  #: of processes tools start, every agent (docs/config.md)
    fsync: str = "step"
    sessions_dir: str | None = None
    source: str | None = None

    def agent_config(self, name: str) -> AgentConfig:
        return self.agents.get(name) or AgentConfig()

    def plugin_settings(self, name: str) -> Mapping[str, Any]:
        return self.plugins.get(name, {})

    def agent_names(self) -> list[str]:
        """The agents that exist: every ``[agents.NAME]`` (and those plugins register, once
        merged), and ``default``, which exists without a table when it is the ``agent``. Any
        other ``agent`` without a table is not one (:func:`unknown_agent`)."""
        names = list(self.agents)
        if self.agent not in names and self.agent == "default":
            names.insert(0, self.agent)
        return names


def unknown_agent(cfg: Config, name: str) -> Exception:
    """The error for agent ``name``, which ``cfg`` does not have: a :class:`ConfigError` naming
    the file, line and key when it is the config's own ``agent = …`` (a typo there must not
    run a fresh agent with every plugin), else a :class:`UsageError` (``-a NAME``). Both say
    the nearest configured agent."""
    known = cfg.agent_names()
    if name != cfg.agent:
        from dsh.core.errors import UsageError

        return UsageError(unknown_name("agent", name, known, "configured"))
    text = None
    if cfg.source and os.path.isfile(cfg.source):
        try:
            text = read_config_text(Path(cfg.source))
        except (OSError, ConfigError):
            text = None
    choices = known if "default" in known else [*known, "default"]
    hint = did_you_mean(name, choices, "configured")
    if not hint.startswith(";"):
        hint = (f" (configured: {', '.join(known) or 'none'}); add an [agents.{_dotted(name)}] "
                "table, or leave agent out to use 'default'")
    return ConfigError(f"{cfg.source or 'config'}{_line_of(text, 'agent')}: key 'agent': "
                       f"unknown agent {name!r}{hint}")


def default_config_path() -> Path:
    """``$DSH_CONFIG``, else ``$XDG_CONFIG_HOME/dsh/config.toml`` (``~/.config``)."""
    env = os.environ.get("DSH_CONFIG")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "dsh" / "config.toml"


def load_config(path: str | Path | None = None, *, required: bool = False) -> Config:
    """Read the config file (``path``, else :func:`default_config_path`).

    A missing default file gives the defaults; a missing explicit file is an error.
    """
    explicit = path is not None or bool(os.environ.get("DSH_CONFIG"))
    p = Path(path) if path is not None else default_config_path()
    try:
        text = read_config_text(p)
    except FileNotFoundError:
        if explicit or required:
            raise ConfigError(f"{p}: config file not found") from None
        return Config()
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    return config_from_dict(data, source=str(p), text=text)


BOM = "\ufeff"
CONFIG_CAP = 4 * 1024 * 1024  # the largest config file read


def read_config_text(path: Path) -> str:
    """The text of a config file, without the UTF-8 byte-order mark some editors write.

    Raises :class:`FileNotFoundError` for a missing file and :class:`ConfigError` for any
    other failure (a directory, no permission, bytes that are not UTF-8).
    """
    from dsh.core import files

    if os.path.realpath(path) == os.devnull:  # `--config /dev/null`: the idiom for "none"
        return ""
    try:  # bounded; a FIFO or any other device is refused, not waited on
        data = files.read_regular(path, CONFIG_CAP)
    except FileNotFoundError:
        raise
    except (files.NotRegular, files.TooLarge) as exc:
        why = (f"it is {exc.kind}, not a regular file" if isinstance(exc, files.NotRegular)
               else f"larger than {CONFIG_CAP} bytes")
        raise ConfigError(f"{path}: cannot read config file: {why}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: config file is not UTF-8 text (byte "
                          f"0x{data[exc.start]:02x})") from None
    return text[1:] if text.startswith(BOM) else text


def config_from_dict(data: Mapping[str, Any], *, source: str | None = None,
                     text: str | None = None) -> Config:
    """Validate a config mapping (from TOML or the API) into a :class:`Config`.

    Every problem is a :class:`ConfigError` naming ``source``, the key as a dotted path (and
    its line when ``text`` is given) and what was expected.
    """
    where = source or "config"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a table of settings, got {_toml_kind(data)}")
    if "source" in data:
        raise ConfigError(f"{where}: unknown key 'source'")
    _check_keys(data, Config, where, text, prefix="")
    agents = data.get("agents")
    for name, agent in (agents.items() if isinstance(agents, Mapping) else ()):
        if isinstance(agent, Mapping):
            _check_keys(agent, AgentConfig, where, text, prefix=f"agents.{name}.")
            if isinstance(agent.get("limits"), Mapping):
                _check_limits(agent["limits"], where, text, f"agents.{name}.limits.")
    if isinstance(data.get("limits"), Mapping):
        _check_limits(data["limits"], where, text, prefix="limits.")
    conv = _converter()
    import cattrs

    try:
        cfg = conv.structure({**data, "source": source}, Config)
    except cattrs.BaseValidationError as exc:
        msgs = [_tidy(m, text) for m in cattrs.transform_error(
            exc, path="", format_exception=_format_exception)]
        raise ConfigError(f"{where}{msgs[0][0]}: " + "; ".join(m for _, m in msgs)) from None
    if cfg.fsync not in FSYNC_CHOICES:
        raise ConfigError(
            f"{where}{_line_of(text, 'fsync')}: key 'fsync': expected one of "
            f"{', '.join(map(repr, FSYNC_CHOICES))}, got {_toml_kind(cfg.fsync)}"
        )
    counts = [("max_steps", cfg.max_steps), ("max_continuations", cfg.max_continuations)]
    counts += [(f"agents.{n}.max_steps", a.max_steps) for n, a in cfg.agents.items()]
    for key, value in counts:
        if value is not None and value < 0:
            raise ConfigError(f"{where}{_line_of(text, key.rpartition('.')[2])}: key {key!r}: "
                              f"expected an integer ≥ 0, got integer {value}")
    from dsh.config import modelcheck

    def line_of(key: str) -> str:  # a key of its own line, else in an inline table
        found = _line_of(text, key)
        m = None if found or not text else re.search(
            rf"[{{,]\s*[\"']?{re.escape(key)}[\"']?\s*=", text)
        return f":{text.count(chr(10), 0, m.start()) + 1}" if m and text else found

    for name, agent in cfg.agents.items():
        _check_options(agent.options, where, text, f"agents.{name}.options")
        model_id = agent.model or cfg.model
        if model_id and modelcheck.adapter_of(model_id, cfg.models.get(model_id)) in \
                modelcheck.ADAPTER_KEYS:
            modelcheck.check_options(agent.options, where, f"agents.{name}.options", line_of)
    for model_id, settings in cfg.models.items():
        _check_model(settings, where, text, f"models.{_dotted(model_id)}")
        modelcheck.check_model_keys(model_id, settings, where, f"models.{_dotted(model_id)}",
                                    line_of)
    _check_compaction(cfg, where, text)
    from dsh.config.finite import refuse_non_finite

    refuse_non_finite(data, where, text, _line_of)  # after the particular keys' checks
    return cfg


# --------------------------------------------------------------------------------------------
# Rules shared with the command line (one function each, so config and CLI cannot disagree)
# --------------------------------------------------------------------------------------------


def check_limit(name: str, value: Any) -> int | float:
    """The value of budget limit ``name`` if it is valid, else :class:`ValueError` saying
    what was expected. The one rule for ``[limits]``, ``[agents.X.limits]`` and ``-L``:
    counts are positive integers (a boolean is not one), ``cost`` and ``seconds`` positive
    finite numbers."""
    if name not in LIMIT_NAMES:
        raise ValueError(unknown_name("limit", name, LIMIT_NAMES, "one of"))
    integer = "float" not in str(attrs.fields_dict(Limits)[name].type)
    expected = "a positive integer" if integer else "a positive number"
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not (math.isfinite(value) and value > 0):
        raise ValueError(f"expected {expected}, got {_toml_kind(value)}")
    number: int | float = value
    return number


def _check_limits(table: Mapping[str, Any], where: str, text: str | None, prefix: str) -> None:
    _check_keys(table, Limits, where, text, prefix)
    for key, value in table.items():
        if value is None:  # from the API: unset
            continue
        try:
            check_limit(key, value)
        except ValueError as exc:
            raise ConfigError(f"{where}{_line_of(text, key)}: key {prefix + key!r}: "
                              f"{exc}") from None


def _check_options(options: Any, where: str, text: str | None, key: str) -> None:
    problem = json_problem(options)
    if problem is not None:
        leaf = re.split(r"[.\[]", problem[0])[-1].strip('"') if problem[0] else "options"
        raise ConfigError(f"{where}{_line_of(text, leaf)}: key {options_error(options, key)}")


def _check_model(settings: Mapping[str, Any], where: str, text: str | None, key: str) -> None:
    """The ``[models.ID]`` keys dsh reads itself; an adapter checks the rest."""
    for name in ("adapter", "model"):
        value = settings.get(name)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}{_line_of(text, name)}: key '{key}.{name}': expected a "
                              f"string, got {_toml_kind(value)}")
    if "options" in settings:
        if not isinstance(settings["options"], Mapping):
            raise ConfigError(f"{where}{_line_of(text, 'options')}: key '{key}.options': "
                              f"expected a table, got {_toml_kind(settings['options'])}")
        _check_options(settings["options"], where, text, f"{key}.options")
    price = settings.get("price")
    if price is None:
        return
    if not isinstance(price, Mapping):
        raise ConfigError(f"{where}{_line_of(text, 'price')}: key '{key}.price': expected a "
                          f"table such as {{input = 0.15, output = 0.6}}, got {_toml_kind(price)}")
    for name, value in price.items():
        if name not in MODEL_PRICE_KEYS:
            raise ConfigError(f"{where}{_line_of(text, 'price')}: key '{key}.price': "
                              + unknown_name("key", str(name), MODEL_PRICE_KEYS, "valid keys"))
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                math.isfinite(value) and value >= 0):
            raise ConfigError(f"{where}{_line_of(text, 'price')}: key '{key}.price.{name}': "
                              f"expected a number ≥ 0 (per million tokens), got "
                              f"{_toml_kind(value)}")


def _check_compaction(cfg: Config, where: str, text: str | None) -> None:
    """``compaction``, ``compact_at``, ``context_window`` at the top level and per agent."""
    scopes: list[tuple[str, Any]] = [("", cfg)]
    scopes += [(f"agents.{n}.", a) for n, a in cfg.agents.items()]
    for prefix, c in scopes:
        if c.compaction is not None and not c.compaction.strip():
            raise ConfigError(f"{where}{_line_of(text, 'compaction')}: {prefix}compaction "
                              "must name a strategy (auto, mask, summarize, off, or a plugin's)")
        at = c.compact_at
        if at is not None and not (0 < at <= 1):
            raise ConfigError(f"{where}{_line_of(text, 'compact_at')}: {prefix}compact_at "
                              f"must be a fraction of the window in (0, 1], not {at!r}")
        window = c.context_window
        if window is not None and (isinstance(window, bool) or window < 16):
            raise ConfigError(f"{where}{_line_of(text, 'context_window')}: "
                              f"{prefix}context_window must be a number of tokens ≥ 16, "
                              f"not {window!r}")


def _tidy(msg: str, text: str | None) -> tuple[str, str]:
    """``(":LINE" or "", message)``: cattrs says ``expected … @ $.agents['x'].max_steps``;
    name the key as it is written in TOML (``agents.x.max_steps``) and find its line."""
    m = re.match(r"(.*) @ \$?\.?(.*)$", msg)
    if not m:
        return "", msg
    key = re.sub(r"\['([^']*)'\]", r".\1", m.group(2)).lstrip(".")
    return _line_of(text, key.rpartition(".")[2]), f"key {key!r}: {m.group(1)}"


class _WrongType(TypeError):
    """Raised by the strict structure hooks; its message is shown as it is."""


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, _WrongType):
        return str(exc)
    from cattrs.v import format_exception

    return format_exception(exc, type_).replace("a mapping", "a table")


def _check_keys(data: Mapping[str, Any], cls: type, where: str, text: str | None,
                prefix: str) -> None:
    valid = [f.name for f in attrs.fields(cls) if f.name != "source"]
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{where}: key {key!r} in {prefix.rstrip('.') or 'the top level'}:"
                              " keys must be strings")
        if key not in valid:
            import difflib  # only on an error: it costs a millisecond at start-up

            near = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(valid)}"
            raise ConfigError(f"{where}{_line_of(text, key)}: unknown key "
                              f"{prefix + key!r}{hint}")


def _line_of(text: str | None, key: str) -> str:
    """``:LINE`` of the first line that sets ``key``, or ``""``."""
    if not text:
        return ""
    pat = re.compile(rf"^[ \t]*[\"']?{re.escape(key)}[\"']?\s*=", re.M)
    m = pat.search(text)
    if not m:
        pat = re.compile(rf"^[ \t]*\[[^\]]*\b{re.escape(key)}\b[^\]]*\]", re.M)
        m = pat.search(text)
    return f":{text.count(chr(10), 0, m.start()) + 1}" if m else ""


_CONVERTER: list[Any] = []


def _converter() -> Any:
    """The config converter, built once per process (the config classes are fixed)."""
    if not _CONVERTER:
        _CONVERTER.append(_make_converter())
    return _CONVERTER[0]


def _make_converter() -> Any:
    """A strict converter: cattrs would otherwise coerce ``autoload = "no"`` to True,
    ``max_steps = 3.7`` to 3 and ``disable = "foo"`` to ``["f", "o", "o"]``."""
    import typing

    import cattrs

    conv = cattrs.Converter(forbid_extra_keys=True)

    def strict(tp: type, ok: Any, expected: str) -> None:
        def hook(value: Any, _: Any) -> Any:
            if not ok(value):
                raise _WrongType(f"expected {expected}, got {_toml_kind(value)}")
            return tp(value)

        conv.register_structure_hook(tp, hook)

    strict(str, lambda v: isinstance(v, str), "a string")
    strict(bool, lambda v: isinstance(v, bool), "a boolean (true or false)")
    strict(int, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
    strict(float, lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number")

    def structure_list(value: Any, tp: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _WrongType(f"expected an array, got {_toml_kind(value)}")
        (item,) = typing.get_args(tp) or (Any,)
        out = []
        for i, v in enumerate(value):
            try:
                out.append(conv.structure(v, item))
            except _WrongType as exc:
                raise _WrongType(f"item {i + 1}: {exc}") from None
        return out

    def is_list(tp: Any) -> bool:
        return typing.get_origin(tp) is list

    conv.register_structure_hook_func(is_list, structure_list)

    def structure_sandbox(value: Any, _: Any) -> Any:
        if value is None or isinstance(value, str | Mapping):
            return value
        raise _WrongType(f"expected a policy name or a table, got {_toml_kind(value)}")

    conv.register_structure_hook_func(lambda tp: tp == SandboxSetting, structure_sandbox)

    def table_hook(cls: type) -> Any:
        """An attrs class (``[agents.X]``, ``[limits]``) is structured from a table only."""
        from cattrs.gen import make_dict_structure_fn

        inner: Any = make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True)

        def hook(value: Any, tp: Any) -> Any:
            if not isinstance(value, Mapping):
                raise _WrongType(f"expected a table, got {_toml_kind(value)}")
            return inner(value, tp)

        return hook

    conv.register_structure_hook_factory(attrs.has, table_hook)

    return conv
