"""Configuration: TOML → attrs classes through a strict cattrs converter (docs/config.md).

Every error names the file, the key (and its line when it can be found) and what was
expected; an unknown key is rejected with the nearest valid name. cattrs is imported only when
a config file is actually read, so a run without one does not pay for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh.errors import ConfigError
from dsh.runcontext import Limits

FSYNC_CHOICES = ("event", "step", "never")


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


@attrs.frozen(kw_only=True)
class Config:
    """The whole configuration. ``source`` is the file it came from (not a TOML key)."""

    model: str = "echo"
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
    #: Budget limits of every run (``[limits]``: requests, steps, tool_calls, input_tokens,
    #: output_tokens, total_tokens, cost, seconds).
    limits: Limits = attrs.field(factory=Limits)
    fsync: str = "step"
    sessions_dir: str | None = None
    source: str | None = None

    def agent_config(self, name: str) -> AgentConfig:
        return self.agents.get(name) or AgentConfig()

    def plugin_settings(self, name: str) -> Mapping[str, Any]:
        return self.plugins.get(name, {})

    def agent_names(self) -> list[str]:
        names = list(self.agents)
        if self.agent not in names:
            names.insert(0, self.agent)
        return names


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
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit or required:
            raise ConfigError(f"{p}: config file not found") from None
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc}") from None
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    return config_from_dict(data, source=str(p), text=text)


def config_from_dict(data: Mapping[str, Any], *, source: str | None = None,
                     text: str | None = None) -> Config:
    """Validate a config mapping (from TOML or the API) into a :class:`Config`."""
    where = source or "config"
    if "source" in data:
        raise ConfigError(f"{where}: unknown key 'source'")
    _check_keys(data, Config, where, text, prefix="")
    agents = data.get("agents")
    for name, agent in (agents.items() if isinstance(agents, Mapping) else ()):
        if isinstance(agent, Mapping):
            _check_keys(agent, AgentConfig, where, text, prefix=f"agents.{name}.")
            if isinstance(agent.get("limits"), Mapping):
                _check_keys(agent["limits"], Limits, where, text, f"agents.{name}.limits.")
    if isinstance(data.get("limits"), Mapping):
        _check_keys(data["limits"], Limits, where, text, prefix="limits.")
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
            f"{where}{_line_of(text, 'fsync')}: fsync must be one of "
            f"{', '.join(FSYNC_CHOICES)}, not {cfg.fsync!r}"
        )
    for name, value in (("max_steps", cfg.max_steps), ("max_continuations", cfg.max_continuations)):
        if value < 0:
            raise ConfigError(f"{where}{_line_of(text, name)}: {name} must be ≥ 0")
    return cfg


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


def _toml_kind(value: Any) -> str:
    kinds = ((bool, "boolean"), (int, "integer"), (float, "float"), (str, "string"),
             (list, "array"), (dict, "table"))
    kind = next((name for t, name in kinds if isinstance(value, t)), type(value).__name__)
    return f"{kind} {value!r}" if kind not in ("array", "table") else kind


def _check_keys(data: Mapping[str, Any], cls: type, where: str, text: str | None,
                prefix: str) -> None:
    valid = [f.name for f in attrs.fields(cls) if f.name != "source"]
    for key in data:
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
    pat = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=", re.M)
    m = pat.search(text)
    if not m:
        pat = re.compile(rf"^\s*\[[^\]]*\b{re.escape(key)}\b[^\]]*\]", re.M)
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
        return [conv.structure(v, item) for v in value]

    def is_list(tp: Any) -> bool:
        return typing.get_origin(tp) is list

    conv.register_structure_hook_func(is_list, structure_list)
    return conv
