"""Arguments checked against a tool's whole JSON Schema with ``jsonschema`` (imported on the
first call of an MCP tool: ~25 ms, measured in benchmarks/mcp.py), as readable sentences in
the same form as :func:`dsh.tools.registry.validate`'s: ``arguments.PATH: what is wrong``.

``$ref``/``$defs``, ``oneOf``, ``const``, bounds, patterns and formats-as-annotations all
work: the validator class is the one the schema's ``$schema`` asks for (default 2020-12).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()


def make_validator(schema: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    """A ``validator(arguments) -> problems`` for :func:`dsh.tools.registry.build_tool`; compiled on
    its first use."""
    compiled: list[Any] = []

    def validate(arguments: dict[str, Any]) -> list[str]:
        if not compiled:
            with _lock:
                if not compiled:
                    compiled.append(_compile(schema))
        validator = compiled[0]
        if isinstance(validator, str):  # the schema itself is broken
            return [validator]
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        return [_sentence(e) for e in errors[:10]]

    return validate


def _compile(schema: dict[str, Any]) -> Any:
    import jsonschema
    from jsonschema.exceptions import SchemaError

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return f"the server's input schema is invalid: {exc.message}"
    return cls(schema)


def _sentence(error: Any) -> str:
    path = "arguments" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                                 for p in error.absolute_path)
    message = error.message
    if error.validator == "required":
        # "'x' is a required property" -> the sentence dsh.tools.registry.validate writes
        missing = message.split("'")[1] if message.count("'") >= 2 else message
        return f"{path}: missing required argument {missing!r}"
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = ", ".join(error.schema.get("properties") or {}) or "none"
        return f"{path}: {message} (known: {known})"
    return f"{path}: {message}"
