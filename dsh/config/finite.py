"""Values a configuration cannot carry (docs/security.md): NaN and infinities anywhere, found
without recursion and named by dotted key and line (no setting of dsh or of a first-party
plugin takes one); option values JSON cannot carry; and how TOML names a value."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from dsh.core.errors import ConfigError


def dotted(key: str) -> str:
    """``key`` as one segment of a dotted TOML key (quoted unless it is a bare key)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'"{key}"'


def non_finite(value: Any) -> tuple[str, float] | None:
    """``(dotted key, value)`` of the first NaN or infinity anywhere in ``value`` (tables and
    arrays, plugin tables included), or ``None``. Without recursion."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return path, v
        elif isinstance(v, Mapping):
            stack.extend((f"{path}.{dotted(str(k))}" if path else dotted(str(k)), item)
                         for k, item in reversed(list(v.items())))
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(v))))
    return None


def nan_line(text: str | None, key: str, line_of: Callable[[str | None, str], str]) -> str:
    """``:LINE`` of the line that sets ``key`` to NaN or an infinity, else ``line_of``'s."""
    last = re.sub(r"\[\d+\]$", "", key).rpartition(".")[2].strip('"')
    if text:
        k = rf"[\"']?{re.escape(last)}[\"']?\s*="
        m = (re.search(rf"^[ \t]*{k}.*[+-]?\b(nan|inf)\b", text, re.M)
             or re.search(rf"[{{,]\s*{k}\s*[+-]?(nan|inf)\b", text))  # in an inline table
        if m:
            return f":{text.count(chr(10), 0, m.start()) + 1}"
    return line_of(text, last)


def refuse_non_finite(data: Mapping[str, Any], where: str, text: str | None,
                      line_of: Callable[[str | None, str], str]) -> None:
    """A :class:`ConfigError` naming the first NaN or infinity in ``data`` (file, line, key):
    NaN passes every ``<= 0`` check, so a later check cannot be trusted to catch it."""
    bad = non_finite(data)
    if bad is not None:
        key, value = bad
        raise ConfigError(f"{where}{nan_line(text, key, line_of)}: key {key!r}: got float "
                          f"{value!r} (NaN and infinities are refused in every setting; "
                          "leave a limit out for none)")


#: How deep an option value may nest.
MAX_OPTION_DEPTH = 64


def json_problem(value: Any) -> tuple[str, str] | None:
    """``(path, problem)`` of the first part of ``value`` that JSON cannot carry — a TOML
    date or time, NaN or infinity, a non-string key, another object — or ``None`` when it is
    JSON-compatible. ``path`` is dotted from ``value`` (``""`` for itself)."""
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    while stack:
        path, v, depth = stack.pop()
        if v is None or isinstance(v, str | bool | int):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return path, f"got float {v!r} (JSON has no NaN or infinity)"
            continue
        if depth >= MAX_OPTION_DEPTH:
            return path, f"nested more than {MAX_OPTION_DEPTH} levels deep"
        if isinstance(v, Mapping):
            for k, item in reversed(list(v.items())):
                if not isinstance(k, str):
                    return path, f"has a key that is not a string: {k!r}"
                stack.append((f"{path}.{dotted(k)}" if path else dotted(k), item, depth + 1))
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}[{i}]", item, depth + 1) for i, item in reversed(
                list(enumerate(v))))
        else:
            return path, f"got {toml_kind(v)}"
    return None


def options_error(options: Any, key: str) -> str | None:
    """``"'KEY.PATH': option values must be JSON-compatible …"`` for the first option value
    JSON cannot carry (``key`` names the table: ``agents.coder.options``, ``-o``), or
    ``None`` when every value is fine."""
    problem = json_problem(options)
    if problem is None:
        return None
    path, what = problem
    where = f"{key}.{path}" if path and not path.startswith("[") else key + path
    return (f"{where!r}: option values must be JSON-compatible (a string, number, boolean, "
            f"array or table), {what}")


def toml_kind(value: Any) -> str:
    """``string 'x'``, ``boolean true``, ``date 1979-05-27``, ``array``: a value as TOML
    would name it."""
    import datetime

    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, datetime.datetime):
        return f"date-time {value.isoformat()}"
    if isinstance(value, datetime.date):
        return f"date {value.isoformat()}"
    if isinstance(value, datetime.time):
        return f"time {value.isoformat()}"
    if value is None:
        return "nothing (None)"
    kinds = ((int, "integer"), (float, "float"), (str, "string"),
             (list | tuple, "array"), (Mapping, "table"))
    kind = next((name for t, name in kinds if isinstance(value, t)), None)
    if kind is None:
        return f"a Python {type(value).__name__}"
    if kind in ("array", "table"):
        return f"an {kind}" if kind == "array" else f"a {kind}"
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"
