"""NaN and infinities anywhere in a configuration (docs/security.md): found without recursion,
named by dotted key and line. No setting of dsh or of a first-party plugin takes one."""

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
