"""Structured output (issue 17): a JSON Schema the answer must match.

``dsh run --schema SCHEMA`` and ``app.run(..., output_schema=...)`` put the schema in the
turn's recorded options (key :data:`OPTION`), so it is in the ledger like everything else the
model sees (MISSION C3), and each adapter sends it by its provider's native mechanism
(``response_format`` for OpenAI-compatible servers, a forced output tool for Anthropic).
The answer is validated on arrival; an invalid one is answered once with the validation error
(a recorded follow-up from this built-in plugin), after which the run reports the error.

``jsonschema`` is imported only when an answer is validated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsh.core.errors import OutputSchemaError
from dsh.core.errors import UsageError
from dsh.hookspecs import hookimpl

#: The option key that carries the schema (recorded on ``turn/start`` with the other options).
OPTION = "output_schema"

#: The name the schema is given where a provider wants one.
SCHEMA_NAME = "output"

#: llm's concise types and their JSON Schema names.
_CONCISE_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
#: How many times an invalid answer is sent back before the run gives up.
RETRIES = 1
_RETRIED = "dsh.llm.schema.retried"
#: The largest schema file, in bytes; how deeply a schema and an answer may nest (the JSON
#: parser and the validator recurse: deeper is an error, never a RecursionError).
MAX_SCHEMA_BYTES = 1024 * 1024
MAX_SCHEMA_DEPTH = 64
MAX_ANSWER_DEPTH = 100


def concise(spec: str) -> dict[str, Any]:
    """llm's concise schema language: ``"name, age int, bio: a short bio"``.

    Fields are separated by commas, or by newlines when there is one (so a description may hold
    commas). Each is ``NAME [TYPE][: description]`` with TYPE one of ``str`` (the default),
    ``int``, ``float``, ``bool``. Every field is required. Unlike llm, an unknown type or a
    repeated name is an error rather than a silent string.
    """
    parts = spec.split("\n") if "\n" in spec else spec.split(",")
    fields = [p.strip() for p in parts if p.strip()]
    if not fields:
        raise UsageError("schema: no fields (expected e.g. 'name, age int')")
    properties: dict[str, Any] = {}
    for field in fields:
        head, _, description = field.partition(":")
        words = head.split()
        if not words or len(words) > 2 or not _NAME.fullmatch(words[0]):
            raise UsageError(f"schema: cannot read field {field!r} (expected NAME [TYPE][: "
                             "description], TYPE one of str, int, float, bool)")
        name = words[0]
        kind = words[1] if len(words) == 2 else "str"
        if kind not in _CONCISE_TYPES:
            raise UsageError(f"schema: field {name!r} has unknown type {kind!r} (known: "
                             + ", ".join(_CONCISE_TYPES) + ")")
        if name in properties:
            raise UsageError(f"schema: field {name!r} appears twice")
        prop: dict[str, Any] = {"type": _CONCISE_TYPES[kind]}
        if description.strip():
            prop["description"] = description.strip()
        properties[name] = prop
    return {"type": "object", "properties": properties, "required": list(properties)}


def load(spec: str | Mapping[str, Any]) -> dict[str, Any]:
    """A schema from what a user gave: a mapping, inline JSON (``{...}``), a JSON file's path,
    or the concise language. The schema itself is checked (a clear error names what is wrong
    and where); its top level must be an object schema."""
    if isinstance(spec, Mapping):
        try:
            schema, where = _plain(spec), "output_schema"
        except RecursionError:
            raise UsageError("output_schema: nested too deeply") from None
    elif spec.lstrip().startswith("{"):
        schema, where = _json(spec, "--schema"), "--schema"
    elif Path(spec).expanduser().is_file() or spec.endswith(".json"):
        text = _read_file(spec)
        schema, where = _json(text, f"schema file {spec}"), f"schema file {spec}"
    else:
        schema, where = concise(spec), "--schema"
    if not isinstance(schema, dict):
        raise UsageError(f"{where}: a schema must be a JSON object, not "
                         f"{type(schema).__name__}")
    if schema.get("type", "object") != "object":
        raise UsageError(f"{where}: the top level must be an object schema "
                         f"(\"type\": \"object\"), not {schema.get('type')!r}")
    from dsh.core.sanitize import nesting_depth

    if nesting_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise UsageError(f"{where}: nested more than {MAX_SCHEMA_DEPTH} levels deep")
    ref = _outside_ref(schema)
    if ref is not None:
        raise UsageError(f"{where}: $ref {ref[:200]!r} points outside the schema; dsh resolves "
                         "only references inside it ('#/$defs/...') and never fetches one")
    problem = schema_error(schema)
    if problem:
        raise UsageError(f"{where}: not a valid JSON Schema: {problem}")
    return schema


def _read_file(spec: str) -> str:
    """A schema file's text: a regular file (a FIFO or device is refused without a read) of
    at most :data:`MAX_SCHEMA_BYTES`."""
    from dsh.core.files import NotRegular
    from dsh.core.files import TooLarge
    from dsh.core.files import read_regular
    from dsh.core.files import reason

    where = f"schema file {spec}"
    try:
        raw = read_regular(Path(spec).expanduser(), MAX_SCHEMA_BYTES)
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except NotRegular:
        raise UsageError(f"{where}: not a regular file") from None
    except TooLarge:
        raise UsageError(f"{where}: larger than {MAX_SCHEMA_BYTES} bytes") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({reason(exc)})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: cannot read it ({exc})") from None


def _outside_ref(schema: Any) -> str | None:
    """The first ``$ref``/``$dynamicRef`` of ``schema`` that is not a fragment of the schema
    itself (``#...``), or None. Walked without recursion (the depth is checked first)."""
    stack = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            for key, sub in value.items():
                if key in ("$ref", "$dynamicRef") and isinstance(sub, str):
                    if not sub.startswith("#"):
                        return sub
                else:
                    stack.append(sub)
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return None


def _refuse(uri: str) -> Any:
    """The registry's ``retrieve``: no schema is ever fetched (not a URL, not a file)."""
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


def _validator(schema: Mapping[str, Any]) -> Any:
    """A Draft 2020-12 validator whose references resolve only inside ``schema`` (and the
    metaschemas jsonschema ships): jsonschema's default registry would fetch an ``http``
    ``$ref`` with urllib."""
    import jsonschema  # type: ignore[import-untyped]
    from referencing import Registry

    return jsonschema.Draft202012Validator(_plain(schema),
                                           registry=Registry(retrieve=_refuse))  # type: ignore[call-arg]


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply") from None
    except ValueError as exc:
        raise UsageError(f"{where}: not JSON: {exc}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def schema_error(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (Draft 2020-12), or None."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(_plain(schema))
    except jsonschema.SchemaError as exc:
        at = "/".join(str(p) for p in exc.absolute_path)
        return f"{exc.message}" + (f" (at {at})" if at else "")
    return None


def parse_answer(text: str) -> Any:
    """The JSON document of an answer. A document wrapped in a Markdown code fence is taken
    from inside it (models add one even when asked not to); anything else around it is not."""
    from dsh.core.sanitize import loads_strict
    from dsh.core.sanitize import nesting_depth

    body = text.strip()
    fence = re.fullmatch(r"```[A-Za-z0-9_-]*\n(.*?)\n?```", body, flags=re.DOTALL)
    if fence:
        body = fence.group(1).strip()
    try:
        value = loads_strict(body)  # no NaN/Infinity: stdout gets a JSON document
    except RecursionError:
        raise ValueError(f"nested more than {MAX_ANSWER_DEPTH} levels deep") from None
    if nesting_depth(value, MAX_ANSWER_DEPTH) > MAX_ANSWER_DEPTH:
        raise ValueError(f"nested more than {MAX_ANSWER_DEPTH} levels deep")
    return value


def problems(text: str, schema: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """``(value, [])`` when ``text`` is a JSON document matching ``schema``; otherwise
    ``(None, problems)``, each naming where in the document it is (``$.items[2].name``)."""
    try:
        value = parse_answer(text)
    except ValueError as exc:
        return None, [f"the answer is not a JSON document ({exc})"]
    from referencing.exceptions import Unresolvable

    try:
        errors = list(_validator(schema).iter_errors(value))
    except Unresolvable as exc:  # a schema from a hand-edited ledger: load() refuses these
        raise OutputSchemaError(f"the output schema's reference {str(exc)[:200]} cannot be "
                                "resolved (dsh never fetches one)") from None
    except RecursionError:
        return None, ["the answer is nested too deeply to be checked against the schema"]
    found = []
    for error in sorted(errors, key=lambda e: list(e.absolute_path))[:5]:
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                             for p in error.absolute_path)
        found.append(f"{path}: {error.message}")
    return (None, found) if found else (value, [])


def active(turn: Any) -> Mapping[str, Any] | None:
    """The output schema the turn's requests carry (from its recorded options), or None."""
    options = turn.ledger.projection.options or {}
    schema = options.get(OPTION)
    return schema if isinstance(schema, Mapping) else None


@hookimpl(trylast=True)
def turn_stopping(turn: Any) -> str | None:
    """Send an answer that does not match the turn's schema back once, with the problems."""
    schema = active(turn)
    if schema is None or turn.steps == 0:
        return None
    value, found = problems(turn.output, schema)
    if not found:
        return None
    retried = turn.ctx.data.get(_RETRIED, 0)
    if retried >= RETRIES:
        raise OutputSchemaError("the answer does not match the output schema: "
                                + "; ".join(found))
    turn.ctx.data[_RETRIED] = retried + 1
    return ("Your answer does not match the required JSON Schema:\n- " + "\n- ".join(found)
            + "\nReply again with only the corrected JSON document.")


# -- the providers' mechanisms (called by the adapters' build_body) ----------------------------

#: ``[models.ID] schema_dialect`` for OpenAI-compatible servers: how ``response_format`` says
#: "this schema". ``json_schema`` is OpenAI's; llama-cpp-python's server rejects it and takes
#: ``{"type": "json_object", "schema": …}`` (``json_object``).
DIALECTS = ("json_schema", "json_object")

#: The tool an Anthropic model is made to call with the answer as its input.
OUTPUT_TOOL = "json_answer"


def response_format(schema: Mapping[str, Any], dialect: str) -> dict[str, Any]:
    """OpenAI-compatible ``response_format`` for ``schema`` in ``dialect``."""
    if dialect == "json_object":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "schema": schema}}


def responses_format(body: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """OpenAI Responses API: ``text.format`` (kept beside other ``text`` settings such as
    ``verbosity``). Not strict: strict mode rejects most hand-written schemas."""
    text = dict(body.get("text") or {})
    text["format"] = {"type": "json_schema", "name": SCHEMA_NAME, "schema": schema,
                      "strict": False}
    body["text"] = text


def output_tool(body: dict[str, Any], schema: Mapping[str, Any], *, forced: bool) -> None:
    """Anthropic: add the output tool to ``body`` and make the model call it — that tool alone
    when the request has no other tools, any tool otherwise (``forced``; with extended
    thinking, which refuses forced tool use, the model is only asked)."""
    tools = list(body.get("tools") or ())
    if any(isinstance(t, Mapping) and t.get("name") == OUTPUT_TOOL for t in tools):
        raise UsageError(f"--schema: a tool is already named {OUTPUT_TOOL!r}, the name the "
                         "output schema is sent under for Anthropic models")
    tools.append({"name": OUTPUT_TOOL, "description": "Give your final answer: call this "
                  "exactly once, with the answer as the input.", "input_schema": schema})
    body["tools"] = tools
    if forced:
        body["tool_choice"] = ({"type": "tool", "name": OUTPUT_TOOL} if len(tools) == 1
                               else {"type": "any"})


def answer_from_tool(response: Any) -> Any:
    """Anthropic: the output tool's call as the answer's text (a JSON document)."""
    import attrs

    calls = [c for c in response.tool_calls if c.name == OUTPUT_TOOL]
    if not calls:
        return response
    from dsh.core.messages import thaw

    rest = tuple(c for c in response.tool_calls if c.name != OUTPUT_TOOL)
    if rest:  # an answer given beside other tool calls is premature: the tools run first
        return attrs.evolve(response, tool_calls=rest)
    text = json.dumps(thaw(calls[-1].arguments), ensure_ascii=False)
    return attrs.evolve(response, text=text, tool_calls=(), tool_call_source=None)
