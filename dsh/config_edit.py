"""Writing the config file: ``dsh config init`` and ``dsh config set`` (docs/config.md).

``set`` reads the file as TOML, changes one key, validates the whole result with
:func:`dsh.config.config_from_dict` and writes it back with tomli-w, so every other key is
preserved — comments and formatting are not (tomli-w writes data, not documents). ``init``
writes a commented starter file as text.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from dsh.config import Config
from dsh.config import config_from_dict
from dsh.errors import ConfigError
from dsh.errors import UsageError

STARTER = '''\
# dsh configuration (docs/config.md). Every key is optional.

# Defaults for `dsh run` when no -m / -a is given.
model = "echo"          # an adapter id: echo, scripted:FILE, openai:MODEL, anthropic:MODEL
agent = "default"

# max_steps = 20        # steps per turn before the run stops with exit code 3
# fsync = "step"        # "event", "step" or "never"
# sessions_dir = "~/.local/share/dsh/sessions"

# Plugins: every installed plugin is loaded unless autoload = false. Block built-ins or
# installed plugins by name, or import extra plugin modules by dotted name.
# disable = ["dsh.prompt"]
# load = ["my_plugins.review"]

# [agents.default]
# system = "You are a careful assistant."
# plugins = ["shell"]   # entry-point names; absent means every installed plugin
# tools = ["read_file"] # allow list; absent means every tool of its plugins

# [agents.coder]
# model = "openai:gpt-4o-mini"
# max_steps = 40
# options = { temperature = 0.2 }
# subagents = ["default"]   # gives coder an ask_default(prompt) tool (a nested run)

# [limits]              # budget of every run (docs/execution.md); agents may override
# requests = 50
# cost = 0.25           # priced with [models.ID] price = { input = …, output = … }

# [plugins.shell]       # settings handed to the plugin named "shell"
# timeout = 30

# [models."openai:gpt-4o-mini"]
# api_key_env = "OPENAI_API_KEY"
'''


def init_config(path: Path, *, force: bool = False) -> Path:
    """Write the starter file at ``path`` (``0600``, parent directories created)."""
    if path.exists() and not force:
        raise UsageError(f"{path} already exists (use --force to overwrite it)")
    _write(path, STARTER)
    return path


def parse_key(key: str) -> list[str]:
    """The segments of a dotted TOML key: ``agents.coder.model``, ``models."gpt-4.1".x``."""
    try:
        data: Any = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError:
        raise UsageError(f"invalid key {key!r}: expected a dotted TOML key such as "
                         "agents.coder.model") from None
    parts = []
    while isinstance(data, dict):
        (name, data), = data.items()
        parts.append(name)
    return parts


def parse_value(raw: str) -> Any:
    """``raw`` as a TOML value if it is one (``3``, ``true``, ``["a", "b"]``, ``"x"``),
    otherwise as a plain string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def read_text(path: Path) -> str:
    """The file's text; ``""`` when it does not exist."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None


def set_value(path: Path, key: str, raw: str) -> bool:
    """Set ``key`` to ``raw`` (parsed by :func:`parse_value`) in the file at ``path``.

    The result is validated before anything is written; an invalid result raises
    :class:`~dsh.errors.ConfigError` and leaves the file untouched. Returns True when the
    file had comments (tomli-w does not keep them).
    """
    parts = parse_key(key)
    text = read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    table = data
    for i, part in enumerate(parts[:-1]):
        inner = table.setdefault(part, {})
        if not isinstance(inner, dict):
            raise ConfigError(f"{path}: cannot set {key}: {'.'.join(parts[:i + 1])} is not "
                              "a table")
        table = inner
    table[parts[-1]] = parse_value(raw)
    config_from_dict(data, source=str(path))
    import tomli_w

    _write(path, tomli_w.dumps(data))
    return any(line.lstrip().startswith("#") for line in text.splitlines())


def effective(cfg: Config) -> dict[str, Any]:
    """Every setting with its effective value (defaults included), ready for tomli-w:
    unset optional keys (``None``) and empty tables are left out."""
    import attrs

    data = attrs.asdict(cfg)
    data.pop("source", None)
    return _prune(data)


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in pruned.items() if v != {}}
    return value


def _write(path: Path, text: str) -> None:
    """Write atomically (temporary file, then rename), ``0600`` for a new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
