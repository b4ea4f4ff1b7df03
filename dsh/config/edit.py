"""Writing the config file: ``dsh config init``, ``dsh config set`` and ``dsh config unset``
(docs/config.md).

``set`` and ``unset`` compute the new settings from the file as TOML, validate the whole result
with :func:`dsh.config.loader.config_from_dict`, then edit the file as a document with tomlkit:
comments, key order, blank lines and layout are kept and only the changed key's line differs.
The edited text is read back and must give exactly the validated settings; if tomlkit cannot
make that edit (a layout it cannot extend in place), the file is rewritten with tomli-w
instead, which keeps every key but not the comments, and the caller is told so. ``init``
writes a commented starter file as text. tomlkit is imported only here, when a file is edited.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from dsh.config.loader import BOM
from dsh.config.loader import Config
from dsh.config.loader import config_from_dict
from dsh.config.loader import read_config_text
from dsh.core.errors import ConfigError
from dsh.core.errors import UsageError

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


_SENTINEL = "dsh-config-set-sentinel"


def parse_key(key: str) -> list[str]:
    """The segments of a dotted TOML key: ``agents.coder.model``, ``models."gpt-4.1".x``."""
    invalid = UsageError(f"invalid key {key!r}: expected a dotted TOML key such as "
                         "agents.coder.model or models.\"openai:gpt-4o\".base_url")
    if not key.strip():
        raise invalid
    try:
        data: Any = tomllib.loads(f"{key} = '{_SENTINEL}'")
    except tomllib.TOMLDecodeError:
        raise invalid from None
    parts = []
    while isinstance(data, dict):
        if len(data) != 1:
            raise invalid
        (name, data), = data.items()
        parts.append(name)
    if data != _SENTINEL:  # ``a = 1 #`` parses, but is not a key
        raise invalid
    return parts


def parse_value(raw: str) -> Any:
    """``raw`` as a TOML value if it is exactly one (``3``, ``true``, ``["a", "b"]``,
    ``"x"``), otherwise as a plain string (``openai:gpt-4o``, or text that would parse as
    more than a value, such as ``1\nx = 2``)."""
    try:
        data = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    return data["v"] if len(data) == 1 else raw


def read_text(path: Path) -> str:
    """The file's text (without a UTF-8 byte-order mark); ``""`` when it does not exist."""
    try:
        return read_config_text(path)
    except FileNotFoundError:
        return ""


def set_value(path: Path, key: str, raw: str) -> bool:
    """Set ``key`` to ``raw`` (parsed by :func:`parse_value`) in the file at ``path``.

    The result is validated before anything is written; an invalid result raises
    :class:`~dsh.core.errors.ConfigError` and leaves the file untouched. The file is edited in
    place: its comments, order and layout are kept, only the key's line changes (a new key
    goes after the last key of its table, a new table at the end). A symbolic link is written
    through (its target is replaced), a byte-order mark is kept. Returns True when the
    comments could not be kept (a layout tomlkit cannot edit: the file was rewritten).
    """
    for what, text_ in (("key", key), ("value", raw)):
        bad = _not_utf8(text_)
        if bad is not None:
            raise ConfigError(f"{path}: cannot set {key.encode('utf-8', 'replace').decode()}: "
                              f"the {what} is not UTF-8 text (byte 0x{bad:02x})")
    parts = parse_key(key)
    text = read_text(path)
    data = _parse(path, text)
    table = data
    for i, part in enumerate(parts[:-1]):
        inner = table.setdefault(part, {})
        if not isinstance(inner, dict):
            raise ConfigError(f"{path}: cannot set {key}: {'.'.join(parts[:i + 1])} is not "
                              "a table")
        table = inner
    value = parse_value(raw)
    table[parts[-1]] = value
    config_from_dict(data, source=str(path))
    from dsh.config.document import set_in_text

    return _save(path, text, set_in_text(text, parts, value, raw), data)


def unset_value(path: Path, key: str) -> None:
    """Remove ``key`` (a value, or a whole table such as ``models.local``) from the file at
    ``path``, keeping everything else as written (a table it leaves empty stays).

    A key that is not set raises :class:`~dsh.core.errors.UsageError`; the result is
    validated before anything is written, as by :func:`set_value`.
    """
    bad = _not_utf8(key)
    if bad is not None:
        raise ConfigError(f"{path}: cannot unset {key.encode('utf-8', 'replace').decode()}: "
                          f"the key is not UTF-8 text (byte 0x{bad:02x})")
    parts = parse_key(key)
    text = read_text(path)
    data = _parse(path, text)
    chain: list[Any] = [data]
    for part in parts[:-1]:
        inner = chain[-1].get(part)
        if not isinstance(inner, dict):
            raise UsageError(f"{path}: {key} is not set")
        chain.append(inner)
    if parts[-1] not in chain[-1]:
        raise UsageError(f"{path}: {key} is not set")
    del chain[-1][parts[-1]]
    config_from_dict(data, source=str(path))
    from dsh.config.document import unset_in_text

    edited = unset_in_text(text, parts)
    after = _reads_as(edited) if edited is not None else None
    for i in range(len(chain) - 1, 0, -1):  # a table only its removed key made (`[a.b]` for
        if chain[i] or not isinstance(after, dict):  # `a`) has no header left: it is gone
            break
        inside = after
        for part in parts[:i - 1]:
            inside = inside.get(part, {}) if isinstance(inside, dict) else {}
        if parts[i - 1] in inside:
            break
        del chain[i - 1][parts[i - 1]]
    _save(path, text, edited, data)


def _parse(path: Path, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _save(path: Path, text: str, edited: str | None, data: dict[str, Any]) -> bool:
    """Write ``edited`` if it reads back as exactly ``data`` (types included), else ``data``
    rewritten with tomli-w; True when that dropped comments ``text`` had."""
    from dsh.config.document import same

    dropped = False
    if edited is None or not same(_reads_as(edited), data):
        import tomli_w

        edited = tomli_w.dumps(data)
        dropped = any(line.lstrip().startswith("#") for line in text.splitlines())
    bom = BOM if _has_bom(path) else ""
    _write(path, bom + edited)
    return dropped


def _reads_as(text: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def _not_utf8(text: str) -> int | None:
    """The first byte of ``text`` that was not UTF-8 (decoded with surrogateescape), or
    ``None``."""
    for ch in text:
        if "\udc80" <= ch <= "\udcff":
            return ord(ch) - 0xDC00
        if "\ud800" <= ch <= "\udfff":
            return 0x3F  # a lone surrogate from elsewhere: no byte to name
    return None


def _has_bom(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(3) == BOM.encode("utf-8")
    except OSError:
        return False


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
    """Write atomically (a temporary file beside the target, then rename).

    A symbolic link is followed: its target is replaced and the link kept. The target keeps
    its mode; a new file gets ``0600``. A read-only file (no write bit) is refused, even for
    root: someone made it so on purpose. Every failure is a :class:`ConfigError` naming the
    file.
    """
    target = Path(os.path.realpath(path))
    shown = f"{path}" if target == path.absolute() else f"{path} (-> {target})"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            st = target.stat()
        except FileNotFoundError:
            mode = 0o600
        else:
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{shown}: cannot write config file: not a regular file")
            mode = stat.S_IMODE(st.st_mode)
            if not mode & 0o222:
                raise ConfigError(f"{shown}: cannot write config file: it is read-only "
                                  f"(mode {mode:04o}); change its mode first")
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(3).hex()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot write config file: "
                          f"{exc.strerror or exc}") from None
