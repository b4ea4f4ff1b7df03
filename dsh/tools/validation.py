"""Argument validation for tools: the subset of JSON Schema that
:func:`dsh.tools.registry.build_tool` produces (plus ``enum`` / ``anyOf``), with readable
sentences (``arguments.path: expected integer, got string``). Re-exported by
:mod:`dsh.tools.registry`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: dict[str, Any], path: str = "arguments") -> list[str]:
    """Problems of ``value`` against ``schema``, as readable sentences (empty when valid)."""
    errors: list[str] = []
    if "anyOf" in schema:
        if all(validate(value, s, path) for s in schema["anyOf"]):
            errors.append(f"{path}: {json.dumps(value)} matches none of the allowed shapes")
        return errors
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)}"]
    types_ = schema.get("type")
    if types_ is not None:
        allowed = types_ if isinstance(types_, list) else [types_]
        if not any(_JSON_TYPES[t](value) for t in allowed if t in _JSON_TYPES):
            return [f"{path}: expected {' or '.join(allowed)}, got {_json_type(value)}"]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{path}: missing required argument {key!r}")
        for key, item in value.items():
            if key in props:
                errors.extend(validate(item, props[key], f"{path}.{key}"))
            elif schema.get("additionalProperties") is False:
                known = ", ".join(props) or "none"
                errors.append(f"{path}: unexpected argument {key!r} (known: {known})")
    elif isinstance(value, list):
        if "prefixItems" in schema:
            if len(value) != len(schema["prefixItems"]):
                errors.append(f"{path}: expected {len(schema['prefixItems'])} items")
            for i, (item, s) in enumerate(zip(value, schema["prefixItems"], strict=False)):
                errors.extend(validate(item, s, f"{path}[{i}]"))
        elif "items" in schema:
            for i, item in enumerate(value):
                errors.extend(validate(item, schema["items"], f"{path}[{i}]"))
    return errors


def _json_type(value: Any) -> str:
    for name, check in _JSON_TYPES.items():
        if check(value) and name != "number":
            return name
    return "number" if isinstance(value, float) else type(value).__name__
