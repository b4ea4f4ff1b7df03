"""llm tool plugins as dsh tools.

An agent selects llm tools by name in ``tools`` of ``[plugins.llm]`` (or of its own
``[agents.NAME.plugin_settings.llm]``), written as ``llm --tool``/``-T`` writes them:

* a function tool by its name: ``"simple_eval"``;
* a :class:`llm.Toolbox` class with its constructor arguments in llm's spec syntax:
  ``'SQLite("data.db")'``, ``'Datasette({"url": "https://…"})'``, ``'Memory'``. Every method
  of the instance becomes a tool named ``CLASS_METHOD`` (``SQLite_query``,
  ``SQLite_schema``), as in llm.

Each becomes a dsh tool with llm's name, description and JSON schema (``Tool.input_schema``,
which llm derives from the signature), registered through dsh's ``register_tools``: calls go
through dsh's tool chain (pre/post execute, approval, budgets, recording), and the
implementation is called exactly as llm's ``Response.execute_tool_calls`` calls it
(``llm_tool_call`` passed to implementations that ask for it, coroutine functions run,
``ToolOutput`` unwrapped, non-string results as JSON).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from dsh.core.errors import ConfigError
from dsh_llm.model import import_llm


def toolbox_name(spec: str) -> str:
    """The class or tool name a spec starts with (``'SQLite("x.db")'`` → ``SQLite``)."""
    return spec.split("(", 1)[0].strip()


def resolve_tools(specs: Any, where: str) -> list[tuple[Any, Any]]:
    """``(llm.Tool, toolbox instance or None)`` for each selected tool, in the given order."""
    if isinstance(specs, str) or not isinstance(specs, Sequence) \
            or not all(isinstance(s, str) and s.strip() for s in specs):
        raise ConfigError(f"{where}: `tools` must be a list of llm tool names, e.g. "
                          f"[\"simple_eval\", 'SQLite(\"data.db\")'], got {specs!r}")
    llm = import_llm()
    from llm.utils import instantiate_from_spec

    available: dict[str, Any] = llm.get_tools()
    toolboxes = {n: t for n, t in available.items()
                 if inspect.isclass(t) and issubclass(t, llm.Toolbox)}
    out: list[tuple[Any, Any]] = []
    for spec in specs:
        name = toolbox_name(spec)
        found = available.get(name)
        if found is None:
            known = ", ".join(sorted(available)) or "none (install an llm tool plugin)"
            raise ConfigError(f"{where}: unknown llm tool {spec!r} (installed: {known})")
        if name not in toolboxes:
            if name != spec.strip():
                raise ConfigError(f"{where}: {name!r} is a function tool: write it without "
                                  f"arguments, not {spec!r}")
            out.append((found, None))
            continue
        try:
            instance = instantiate_from_spec(toolboxes, spec)
            instance.prepare()  # llm runs it before first use; it may add tools
            instance._prepared = True
        except Exception as exc:  # a bad spec, or the toolbox's own complaint (a missing file)
            raise ConfigError(f"{where}: cannot create llm toolbox {spec!r}: "
                              f"{type(exc).__name__}: {exc}") from None
        out.extend((tool, instance) for tool in instance.tools())
    return out


def runner(tool: Any) -> Callable[..., str]:
    """A function calling ``tool``'s implementation as llm does, for dsh's tool chain."""
    llm = import_llm()
    impl = tool.implementation
    try:
        wants_call = "llm_tool_call" in inspect.signature(impl).parameters
    except (TypeError, ValueError):
        wants_call = False

    def run(**arguments: Any) -> str:
        if wants_call:
            from dsh.tools.registry import current_call

            call_id = None
            try:
                call_id = current_call().call.id
            except LookupError:
                pass
            arguments["llm_tool_call"] = llm.ToolCall(name=tool.name, arguments=dict(arguments),
                                                      tool_call_id=call_id)
        result = impl(**arguments)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        if isinstance(result, llm.ToolOutput):
            result = result.output
        if not isinstance(result, str):
            result = json.dumps(result, default=repr)
        return str(result)

    run.__name__ = tool.name
    return run


async def _await(awaitable: Any) -> Any:
    return await awaitable


def register_llm_tools(register: Callable[..., None], specs: Any, where: str) -> None:
    """Register the llm tools ``specs`` names with dsh's ``register`` callback."""
    for tool, instance in resolve_tools(specs, where):
        if tool.implementation is None:
            raise ConfigError(f"{where}: llm tool {tool.name!r} has no implementation")
        schema = dict(tool.input_schema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        # A toolbox instance holds state (a database connection): its methods run one after
        # another, in the thread that runs the step, never concurrently.
        # The description exactly as llm sends it (``tool.description or None`` in its
        # plugins: a docstring with its indentation and blank lines, not trimmed).
        register(runner(tool), name=tool.name, description=tool.description or "",
                 parameters=schema, sequential=instance is not None)


__all__ = ["register_llm_tools", "resolve_tools", "runner"]
