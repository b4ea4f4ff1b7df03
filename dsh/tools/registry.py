"""Tools (MISSION A3): registry, JSON Schema from signatures, validation, the execute chain.

A tool is a plain Python function. Its schema comes from its type hints, its description from
its docstring. Arguments are validated before the call: a bad call becomes an error result the
model can read, never a crash. The ``execute`` hook is an onion: plugin wrappers →
``dsh.tools.registry.dispatch`` (``pre_execute`` / ``post_execute``) → the built-in call.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import re
import threading
import time
import types
import typing
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import ToolError
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import freeze
from dsh.core.messages import thaw
from dsh.hookspecs import hookimpl
from dsh.host.manager import call_impl
from dsh.host.runcontext import _agent_keyword
from dsh.host.runcontext import deprecated_agent
from dsh.tools.dispatch import HookDispatch as HookDispatch  # registered as dsh.tools:HookDispatch
from dsh.tools.dispatch import call_pre_execute as call_pre_execute

if TYPE_CHECKING:
    from dsh.core.messages import Change
    from dsh.host.scope import AgentHandle

_TOOL_OPTIONS = "__dsh_tool__"
_current_call: contextvars.ContextVar[ToolInvocation] = contextvars.ContextVar("dsh_tool_call")


def current_call() -> ToolInvocation:
    """The tool call being executed, inside a tool function (``dsh.current_call()``): its
    ``call.id``, ``arguments``, ``agent_name`` and ``handle``. A thread the tool starts sees
    it only when started in ``contextvars.copy_context().run(...)``.

    :raises dsh.NoToolCall: outside a tool call (a :class:`LookupError` too).
    """
    try:
        return _current_call.get()
    except LookupError:
        from dsh.core.errors import NoToolCall

        raise NoToolCall("dsh.current_call() called outside a tool call (or in a thread the "
                         "tool started without contextvars.copy_context())") from None


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    sequential: bool = False,
    timeout: float | None = None,
) -> Any:
    """Mark a function as a tool and set its options; usable bare (``@tool``) or called.

    :param sequential: never run concurrently with other calls of the same step.
    :param timeout: seconds before the call is abandoned with an error result.
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        opts = {"name": name, "description": description, "sequential": sequential,
                "timeout": timeout}
        setattr(f, _TOOL_OPTIONS, opts)
        return f

    return mark(fn) if fn is not None else mark


@attrs.frozen(kw_only=True)
class ToolDef:
    """A registered tool: the function, its schema and where it came from."""

    #: The tool's name, as the model calls it.
    name: str
    #: What the tool does, for the model (from the docstring by default).
    description: str
    #: The JSON Schema object of its arguments (from the type hints by default).
    parameters: dict[str, Any] = attrs.field(hash=False)
    #: The Python function called with the arguments.
    fn: Callable[..., Any] = attrs.field(eq=False, hash=False, repr=False)
    #: The plugin that registered it.
    plugin: str = ""
    #: Never run concurrently with other calls of the same step.
    sequential: bool = False
    #: Seconds before a call is abandoned with an error result (None: no limit).
    timeout: float | None = None
    #: For a sub-agent tool: the agent it runs (each call gets a child session).
    subagent: str | None = None
    #: Checks the arguments instead of :func:`validate` (a tool whose schema is more than the
    #: subset it covers, e.g. an MCP server's): returns the problems as readable sentences.
    validator: Callable[[dict[str, Any]], list[str]] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False)

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about the tool."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


# --------------------------------------------------------------------------------------------
# Schema from signature and docstring
# --------------------------------------------------------------------------------------------

_PARAM_RE = re.compile(r"^\s*:param\s+(?:\w+\s+)?(\w+):\s*(.*)$")
_GOOGLE_ARG_RE = re.compile(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {param: description})`` from Sphinx ``:param x:`` or Google ``Args:``."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in lines:
        m = _PARAM_RE.match(line)
        if m:
            current = m.group(1)
            params[current] = m.group(2).strip()
            continue
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            g = _GOOGLE_ARG_RE.match(line)
            if g:
                current = g.group(1)
                params[current] = g.group(2).strip()
                continue
            if line and not line[0].isspace():
                in_args = False
            elif current and line.strip():
                params[current] += " " + line.strip()
                continue
        if line.lstrip().startswith(":"):
            current = None
            continue
        if current and line.startswith(" ") and line.strip():
            params[current] += " " + line.strip()
            continue
        if not params and not in_args:
            summary.append(line)
    return "\n".join(summary).strip(), params


def _schema_for(tp: Any, where: str) -> dict[str, Any]:
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is type(None):
        return {"type": "null"}
    if tp in (list, tuple, set, frozenset):
        return {"type": "array"}
    if tp is dict:
        return {"type": "object"}
    if origin in (list, tuple, set, frozenset, Sequence):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = args[:1]
        if origin is tuple and len(args) > 1:
            return {"type": "array", "prefixItems": [_schema_for(a, where) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
        return {"type": "array", "items": _schema_for(args[0], where) if args else {}}
    if origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1 and len(args) == 2:
            inner = _schema_for(non_null[0], where)
            if "type" in inner and isinstance(inner["type"], str):
                return {**inner, "type": [inner["type"], "null"]}
        return {"anyOf": [_schema_for(a, where) for a in args]}
    raise TypeError(f"{where}: cannot describe type {tp!r} as JSON Schema")


def build_tool(
    fn: Callable[..., Any],
    *,
    plugin: str = "",
    name: str | None = None,
    description: str | None = None,
    sequential: bool | None = None,
    timeout: float | None = None,
    parameters: dict[str, Any] | None = None,
    validator: Callable[[dict[str, Any]], list[str]] | None = None,
) -> ToolDef:
    """Describe ``fn`` as a tool. Options given here win over those of :func:`tool`.

    ``parameters`` (a JSON Schema object, used as given) replaces the schema read from the
    signature, for tools whose schema comes from elsewhere (``fn`` then takes ``**kwargs``);
    ``validator`` replaces :func:`validate` for their arguments.
    """
    opts = getattr(fn, _TOOL_OPTIONS, {})
    tool_name = name or opts.get("name") or fn.__name__
    if parameters is not None:
        return ToolDef(
            name=tool_name, description=description or opts.get("description") or "",
            parameters=dict(parameters), fn=fn, plugin=plugin,
            sequential=bool(sequential if sequential is not None else opts.get("sequential")),
            timeout=timeout if timeout is not None else opts.get("timeout"),
            validator=validator,
        )
    doc_summary, doc_params = parse_docstring(fn.__doc__)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise TypeError(f"tool {tool_name!r} ({plugin}): cannot resolve type hints: {exc}") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _schema_for(hints.get(p.name, p.annotation), f"tool {tool_name!r} param {p.name}")
        if p.name in doc_params:
            schema["description"] = doc_params[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        elif p.default is None or isinstance(p.default, (str, int, float, bool)):
            schema["default"] = p.default
        properties[p.name] = schema
    derived: dict[str, Any] = {"type": "object", "properties": properties,
                               "additionalProperties": False}
    if required:
        derived["required"] = required
    return ToolDef(
        name=tool_name,
        description=description or opts.get("description") or doc_summary,
        parameters=derived,
        fn=fn,
        plugin=plugin,
        sequential=bool(sequential if sequential is not None else opts.get("sequential")),
        timeout=timeout if timeout is not None else opts.get("timeout"),
        validator=validator,
    )


def __getattr__(name: str) -> Any:
    if name in ("validate", "_json_type", "_JSON_TYPES"):  # moved to dsh.tools.validation
        from dsh.tools import validation

        return getattr(validation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------


@attrs.define(eq=False)
class ToolOutcome:
    """A tool's result, mutable until it is logged: ``status`` is ``ok`` or ``error``."""

    #: ``ok`` or ``error`` (``budget`` and ``interrupted`` are set by dsh for calls not run).
    status: str = "ok"
    #: The text the model will read, recorded as it is on ``tool/result`` (not redacted: what
    #: is recorded is what is sent, C3; keys are kept out of tool processes instead).
    output: str = ""
    #: How long the call took, in milliseconds (None when it did not run).
    duration_ms: float | None = None
    #: The files the call changed (:func:`dsh.tools.changes.record`), for ``tool/result``.
    changes: tuple[Change, ...] = ()


@attrs.define(eq=False)
class ToolInvocation:
    """One tool call travelling through the ``execute`` chain."""

    #: The model's call as recorded on ``tool/call`` (frozen: id, name, arguments).
    call: ToolCall
    #: The registered tool, or None when the model named a tool the agent does not have.
    tool: ToolDef | None
    #: A plain copy of the call's arguments: change it in ``pre_execute`` to rewrite them.
    arguments: dict[str, Any]
    #: The agent's name (``handle`` is the agent itself: its settings, stashes, events).
    agent_name: str = ""
    #: The reason given to the first :meth:`block`, when the call was refused.
    blocked: str | None = None
    #: The plugin that blocked the call first: in ``pre_execute``, the registered name of
    #: the implementation that called :meth:`block` (as ``step/rejected`` names the plugin);
    #: elsewhere (an ``execute`` wrapper such as ``dsh.budget``) the ``plugin`` it passed.
    blocked_by: str | None = None
    #: For a sub-agent tool: the child session id, chosen before ``tool/call`` is written.
    child_session: str | None = None
    #: Every :meth:`block` in order, as ``(plugin, reason)``: the first decides, later ones
    #: are kept so that each plugin's decision is seen (``blocked`` does not change).
    blocks: list[tuple[str, str]] = attrs.field(factory=list)
    #: The files changed so far by this call (:func:`dsh.tools.changes.record` adds them).
    changes: list[Change] = attrs.field(factory=list)
    # The agent's handle (passed as ``handle=``), read through the ``handle`` property.
    _handle: AgentHandle | None = attrs.field(default=None, repr=False)
    # The pre_execute implementation being called (dsh.tools.dispatch): who blocks.
    _caller: str | None = attrs.field(default=None, init=False, repr=False)

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent: settings, stashes, plugin events."""
        if self._handle is None:
            raise AttributeError("this ToolInvocation was built outside a turn: no handle")
        return self._handle

    @property
    def agent(self) -> str:
        """Deprecated alias of :attr:`agent_name` (removed after one minor version)."""
        deprecated_agent("ToolInvocation")
        return self.agent_name

    def block(self, reason: str, plugin: str | None = None) -> None:
        """Refuse the call: the model receives an error result ``tool call blocked by
        PLUGIN: reason``. The first block wins; a second one (by the same or another plugin)
        is added to :attr:`blocks` and changes nothing else. In ``pre_execute`` the plugin is
        the implementation's registered name and ``plugin`` is ignored."""
        reason = str(reason) if reason else "blocked"
        if self._caller is not None:
            plugin = self._caller
        self.blocks.append((plugin or "", reason))
        if self.blocked is None:
            self.blocked = reason
            self.blocked_by = plugin


ToolInvocation.__init__ = _agent_keyword(ToolInvocation.__init__)  # type: ignore[method-assign]


def _to_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def call_tool(inv: ToolInvocation) -> ToolOutcome:
    """Validate and call; every failure becomes an error outcome."""
    tool_ = inv.tool
    if tool_ is None:
        return ToolOutcome("error", f"unknown tool {inv.call.name!r}")
    if tool_.validator is not None:
        problems = tool_.validator(inv.arguments)
    else:
        from dsh.tools.validation import validate  # a dict lookup once imported

        problems = validate(inv.arguments, tool_.parameters)
    if problems:
        return ToolOutcome("error", "invalid arguments: " + "; ".join(problems))
    if tool_.timeout is None:
        return _call(tool_, inv.arguments)
    return _call_with_timeout(tool_, inv.arguments, tool_.timeout)


def _call(tool_: ToolDef, arguments: dict[str, Any]) -> ToolOutcome:
    try:
        return ToolOutcome("ok", _to_text(tool_.fn(**arguments)))
    except ToolError as exc:
        return ToolOutcome("error", str(exc))
    except Exception as exc:
        return ToolOutcome("error", f"{type(exc).__name__}: {exc}")


def _call_with_timeout(tool_: ToolDef, arguments: dict[str, Any], timeout: float) -> ToolOutcome:
    box: list[ToolOutcome] = []
    ctx = contextvars.copy_context()
    worker = threading.Thread(
        target=lambda: box.append(ctx.run(_call, tool_, arguments)), daemon=True,
        name=f"dsh-tool-{tool_.name}",
    )
    worker.start()
    worker.join(timeout)
    if not box:
        return ToolOutcome("error", f"tool {tool_.name!r} timed out after {timeout:g}s")
    return box[0]


@hookimpl(trylast=True)
def execute(call: ToolInvocation) -> ToolOutcome:
    if call.blocked is not None:
        by = f" by {call.blocked_by}" if call.blocked_by else ""
        return ToolOutcome("error", f"tool call blocked{by}: {call.blocked}")
    start = time.perf_counter()
    token = _current_call.set(call)
    try:
        outcome = call_tool(call)
    finally:
        _current_call.reset(token)
    outcome.duration_ms = round((time.perf_counter() - start) * 1000, 3)
    outcome.changes = tuple(call.changes)  # the files it changed (dsh.tools.changes)
    return outcome


# --------------------------------------------------------------------------------------------
# Registration facade
# --------------------------------------------------------------------------------------------


_BUILT: weakref.WeakKeyDictionary[Any, dict[Any, ToolDef]] = weakref.WeakKeyDictionary()


def _memo_build(fn: Callable[..., Any], plugin: str, options: dict[str, Any]) -> ToolDef:
    """:func:`build_tool`, memoised per function: assembling a second app or agent with the
    same tools reuses their schemas instead of re-reading signatures and docstrings (D1).

    The memo keeps a read-only template; every caller gets its own copy of the schema, so
    one app's plugin changing a schema can never show in another app's agent (C3).
    """
    if options.get("parameters") is not None or options.get("validator") is not None:
        return build_tool(fn, plugin=plugin, **options)  # given, not read: nothing to memoise
    key = (plugin, tuple(sorted(options.items())))
    try:
        per_fn = _BUILT.setdefault(fn, {})
    except TypeError:  # not weak-referenceable: build every time
        return build_tool(fn, plugin=plugin, **options)
    tool_ = per_fn.get(key)
    if tool_ is None:
        built = build_tool(fn, plugin=plugin, **options)
        tool_ = per_fn[key] = attrs.evolve(built, parameters=freeze(built.parameters))
    return attrs.evolve(tool_, parameters=thaw(tool_.parameters))


def collect_tools(pm: Any, agent: Any, allow: Sequence[str] | None = None) -> dict[str, ToolDef]:
    """Call each plugin's ``register_tools`` separately, recording provenance (A3, A6)."""
    table: dict[str, ToolDef] = {}
    # Registration order (built-ins first), so provenance and the tool order read naturally.
    for impl in pm.hook.register_tools.get_hookimpls():
        plugin_name = impl.plugin_name

        def register(fn: Callable[..., Any], _plugin: str = plugin_name, **options: Any) -> None:
            t = _memo_build(fn, _plugin, options)
            if t.name in table:
                from dsh.core.errors import PluginError

                raise PluginError(
                    f"tool {t.name!r} registered twice: by {table[t.name].plugin} and {_plugin}",
                    plugin=_plugin, hook="register_tools",
                )
            table[t.name] = t

        call_impl(impl, "register_tools", register=register, agent=agent)
    if allow is not None:
        table = {k: v for k, v in table.items() if k in allow}
    return table
