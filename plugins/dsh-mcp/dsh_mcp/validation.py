"""Arguments checked against a tool's whole JSON Schema with ``jsonschema`` (imported on the
first call of an MCP tool: ~25 ms, measured in benchmarks/mcp.py), as readable sentences in
the same form as :func:`dsh.tools.registry.validate`'s: ``arguments.PATH: what is wrong``.

``$ref``/``$defs``, ``oneOf``, ``const``, bounds, patterns and formats-as-annotations all
work: the validator class is the one the schema's ``$schema`` asks for (default 2020-12).

The schema is a server's, so it is not trusted (docs/security.md, "MCP servers"):

- **nothing is fetched or read**: references resolve in a ``referencing`` registry with no
  retrieval, so only the schema's own ``#/...`` (and its embedded ``$id`` resources) resolve;
  ``http://``, ``file://`` or a missing ``#/nope`` is an invalid-schema error for that tool,
  never an exception that ends the turn;
- **patterns have a time bound**: ``pattern`` and ``patternProperties`` (also as used by
  ``additionalProperties``) are matched with the ``regex`` module, ``timeout=``
  :data:`PATTERN_TIMEOUT` and ``concurrent=True`` (the GIL is released while it matches, so
  Ctrl-C, SIGTERM and ``--timeout`` still work); a match that runs out of time is an
  invalid-arguments error naming the argument. ``unevaluatedProperties`` together with
  ``patternProperties`` (whose jsonschema code matches with ``re``, unbounded) is refused as
  unsupported.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

#: Seconds one ``pattern`` may take to match one string.
PATTERN_TIMEOUT = 0.5
#: How much of a server-sent value (a ``$ref``, a pattern) an error message quotes.
QUOTE = 120

_lock = threading.Lock()
_classes: dict[Any, Any] = {}


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
        try:
            errors = sorted(validator.iter_errors(arguments),
                            key=lambda e: [str(p) for p in e.absolute_path])
        except Exception as exc:  # noqa: BLE001 - a hostile schema must not end the turn
            return [_broken(exc)]
        return [_sentence(e) for e in errors[:10]]

    return validate


def _compile(schema: dict[str, Any]) -> Any:
    import jsonschema
    from jsonschema.exceptions import SchemaError
    from referencing import Registry

    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        base.check_schema(schema)
    except SchemaError as exc:
        return f"the server's input schema is invalid: {_cut(exc.message)}"
    except Exception as exc:  # noqa: BLE001 - e.g. a RecursionError on absurd nesting
        return _broken(exc)
    if _has_key(schema, "unevaluatedProperties") and _has_key(schema, "patternProperties"):
        return ("the server's input schema is not supported: it combines "
                "unevaluatedProperties with patternProperties")
    # An empty registry with no retrieve function: a $ref outside the schema is unresolvable,
    # never fetched (jsonschema's default would fetch http:// and read file:// references).
    return _bounded(base)(schema, registry=Registry())


def _bounded(base: Any) -> Any:
    """``base`` with the keywords that match regular expressions replaced by bounded ones."""
    cls = _classes.get(base)
    if cls is None:
        import jsonschema

        cls = _classes[base] = jsonschema.validators.extend(base, {
            "pattern": _pattern, "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties})
    return cls


class _TooSlow(Exception):
    pass


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> Any:
    import regex

    return regex.compile(pattern)


def search(pattern: str, text: str, timeout: float = PATTERN_TIMEOUT) -> bool:
    """Whether ``pattern`` matches somewhere in ``text`` (JSON Schema's ``pattern``), within
    ``timeout`` seconds, with the GIL released. Raises :class:`_TooSlow` when it runs out of
    time and ``ValueError`` when the pattern does not compile."""
    import regex

    try:
        compiled = _regex(pattern)
    except regex.error as exc:
        raise ValueError(f"pattern {_cut(pattern)!r} does not compile: {exc}") from None
    try:
        return compiled.search(text, timeout=timeout, concurrent=True) is not None
    except TimeoutError:
        raise _TooSlow(pattern) from None


def _slow(pattern: str) -> str:
    return (f"could not be matched against the pattern {_cut(pattern)!r} within "
            f"{PATTERN_TIMEOUT:g}s (the pattern backtracks too much); not accepted")


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string"):
        return
    try:
        matched = search(pattern, instance)
    except _TooSlow:
        yield ValidationError(f"{_cut(instance)!r} {_slow(pattern)}")
        return
    if not matched:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any,
                        schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = search(pattern, key)
            except _TooSlow:
                yield ValidationError(f"the name {_cut(key)!r} {_slow(pattern)}")
                continue
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: dict[str, Any], schema: Any) -> tuple[set[str], list[str]]:
    """The names not in ``properties`` and matching no ``patternProperties``; and the names
    whose match ran out of time."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras: set[str] = set()
    slow: list[str] = []
    for key in instance:
        if key in properties:
            continue
        try:
            if any(search(p, key) for p in patterns):
                continue
        except _TooSlow:
            slow.append(key)
            continue
        extras.add(key)
    return extras, slow


def _additional_properties(validator: Any, allowed: Any, instance: Any,
                           schema: Any) -> Iterator[Any]:
    """jsonschema's ``additionalProperties``, with bounded pattern matching."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    extras, slow = _additional(instance, schema)
    for key in slow:
        yield ValidationError(f"the name {_cut(key)!r} could not be matched against "
                              f"patternProperties within {PATTERN_TIMEOUT:g}s; not accepted")
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        names = sorted(extras, key=str)
        joined = ", ".join(repr(each) for each in names)
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({joined} {verb} "
                                  "unexpected)")


def _has_key(value: Any, key: str, depth: int = 0) -> bool:
    """Whether ``key`` is a key anywhere in ``value`` (a conservative scan: data under
    ``const``/``enum`` counts too)."""
    if depth > 200:
        return True
    if isinstance(value, dict):
        return key in value or any(_has_key(v, key, depth + 1) for v in value.values())
    if isinstance(value, list):
        return any(_has_key(v, key, depth + 1) for v in value)
    return False


def _broken(exc: BaseException) -> str:
    """One line for a schema that cannot be used to check arguments."""
    from referencing.exceptions import Unresolvable

    if isinstance(exc, Unresolvable):
        ref = str(getattr(exc, "ref", "") or "")
        if ref.startswith("/"):  # a JSON pointer that points nowhere: show it as written
            ref = "#" + ref
        return (f"the server's input schema is invalid: $ref {_cut(ref)!r} cannot be "
                "resolved (dsh resolves only references within the schema and fetches "
                "nothing)")
    if isinstance(exc, RecursionError):
        return "the server's input schema is invalid: it refers to itself without end"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"the server's input schema cannot be used: {_cut(text)}"


def _cut(text: str) -> str:
    return text if len(text) <= QUOTE else text[:QUOTE] + "…"


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
