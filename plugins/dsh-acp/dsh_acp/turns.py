"""One ACP session of ``dsh acp``: its dsh session, the turn running in a worker thread, and
the bridges from that thread to the SDK's asyncio loop — the :class:`Outbox` of
``session/update`` notifications (sent in the order they were made) and the run's asker,
which turns an approval question into ``session/request_permission``.

Turns run one at a time in the whole process (:data:`DIRECTORY`): each runs in its session's
``cwd`` (``os.chdir``), so what dsh records and reads per directory (the turn's ``cwd``, the
project's memory and MCP files) is the editor's project.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from acp import schema

from dsh_acp import convert

#: Held while a turn runs or a session is assembled: the process's working directory is the
#: session's meanwhile.
DIRECTORY = threading.RLock()


@contextlib.contextmanager
def in_directory(cwd: str) -> Iterator[None]:
    with DIRECTORY:
        before = os.getcwd()
        os.chdir(cwd)
        try:
            yield
        finally:
            os.chdir(before)


class Outbox:
    """``session/update`` notifications from any thread, sent one at a time, in order, by one
    task on the loop. :meth:`flush` waits until what was put before it is sent."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: Any) -> None:
        self.loop = loop
        self.conn = conn
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.task = loop.create_task(self._pump())

    def put(self, session_id: str, update: Any) -> None:
        """From any thread; dropped once the loop is gone (the editor disconnected)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (session_id, update))
        except RuntimeError:
            pass

    async def flush(self) -> None:
        done = self.loop.create_future()
        # Through the same callback queue as put(): after everything put before.
        self.loop.call_soon_threadsafe(self.queue.put_nowait, done)
        await done

    async def _pump(self) -> None:
        while True:
            item = await self.queue.get()
            if isinstance(item, asyncio.Future):
                if not item.done():
                    item.set_result(None)
                continue
            session_id, update = item
            try:
                await self.conn.session_update(session_id=session_id, update=update)
            except Exception:  # noqa: BLE001 - a closed connection: nothing more to show
                pass


_OPTIONS = (("allow", "Allow", "allow_once"),
            ("allow-session", "Allow for this session", "allow_always"),
            ("reject", "Reject", "reject_once"))


class AcpSession:
    """An open dsh session served to the editor."""

    def __init__(self, server: Any, app: Any, session: Any, cwd: str, agent: str,
                 mode: str, model: str | None) -> None:
        self.server = server
        self.app = app
        self.session = session
        self.cwd = cwd
        self.agent_name = agent
        self.mode = mode
        self.model = model
        self.running = False
        self.cancelled = False
        self.taken = False  # this turn's prompt is recorded
        self.reason = "cancelled by the editor"
        self.ctx: Any = None
        self.thread: threading.Thread | None = None
        self.pending: set[concurrent.futures.Future[Any]] = set()
        self.grants: list[dict[str, Any]] = []
        self._stop_reason: str | None = None

    @property
    def id(self) -> str:
        return str(self.session.id)

    def agent(self) -> Any:
        overrides: dict[str, Any] = {"mode": self.mode}
        if self.model:
            overrides["model"] = self.model
        agent = self.app.agent(self.agent_name, **overrides)
        agent.model.provider_tools(agent.tool_specs)  # fails now if it cannot be built
        return agent

    # -- the turn, in its worker thread ---------------------------------------------------

    def run(self, text: str) -> Any:
        from dsh.core.errors import UsageError

        if os.path.realpath(self.cwd) != self.cwd:  # swapped for a symlink since it opened
            raise UsageError(f"the session's cwd {self.cwd} is now a link to "
                             f"{os.path.realpath(self.cwd)}: open a new session")
        with in_directory(self.cwd):
            self.session.agent = self.agent()
            text = self._expand(text)
            return self.session.send(
                text, on_text=lambda d: self._put(convert.text_chunk("agent", d)),
                on_reasoning=lambda d: self._put(convert.text_chunk("thought", d)),
                on_event=self._event, context_hook=self._hook, asker=self.ask)

    def _expand(self, text: str) -> str:
        """``/NAME ARGS`` runs like ``dsh run /NAME ARGS`` (the expansion is what is sent and
        recorded); ``//text`` sends ``/text``."""
        if not text.startswith("/"):
            return text
        from dsh.run import commands

        found = commands.split_command(text.split("\n", 1)[0])
        if found is None:
            return commands.unescape(text) if text.startswith("//") else text
        name, arguments = found
        head = text.split("\n", 1)
        agent = self.session.agent
        expansion = commands.expand(agent.pm, agent.handle, name, arguments)
        return expansion.prompt + ("\n" + head[1] if len(head) > 1 else "")

    def _hook(self, ctx: Any) -> None:
        self.ctx = ctx

    def _put(self, update: Any) -> None:
        self.server.outbox.put(self.id, update)

    def _event(self, event: Any) -> None:
        from dsh.ledger.events import AssistantMessage
        from dsh.ledger.events import PluginEvent
        from dsh.ledger.events import ToolCalled
        from dsh.ledger.events import ToolReturned
        from dsh.ledger.events import UserMessage

        if isinstance(event, UserMessage) and not self.taken:
            # The prompt is in the ledger: a cancel that came before now aborts the run (so
            # a cancelled prompt is always recorded, and resumable).
            self.taken = True
            if self.cancelled and self.ctx is not None:
                self.ctx.abort(self.reason)
        elif getattr(event, "type", None) == "tools/pre-execute" and hasattr(event, "data"):
            call_id = event.data.get("call_id")
            if isinstance(call_id, str):
                self._put(schema.ToolCallProgress(session_update="tool_call_update",
                                                  tool_call_id=call_id, status="in_progress"))
        elif isinstance(event, ToolCalled):
            self._put(convert.tool_start(event.call_id, event.name, dict(event.arguments),
                                         self.cwd))
        elif isinstance(event, ToolReturned):
            self._put(convert.tool_done(event.call_id, event.name, event.status, event.output,
                                        event.changes, self.cwd))
        elif isinstance(event, AssistantMessage):
            self._stop_reason = event.stop_reason
        elif isinstance(event, PluginEvent) and (event.plugin, event.name) == (
                "dsh.tasks", "tasks"):
            tasks = event.data.get("tasks")
            if isinstance(tasks, (list, tuple)):
                self._put(convert.plan(tasks))

    def stop_reason(self, result: Any) -> str:
        outcome = result.outcome
        if self.cancelled or outcome in ("aborted", "stopped"):
            return "cancelled"
        if outcome == "rejected":
            return "refusal"
        if outcome == "budget":
            return "max_tokens" if "token" in (result.reason or "") else "max_turn_requests"
        if self._stop_reason in ("max_tokens", "length"):
            return "max_tokens"
        return "end_turn"

    # -- approval questions -----------------------------------------------------------------

    def ask(self, ask: Any) -> Any:
        """The run's asker: ``session/request_permission`` to the editor. No answer within
        ``--permission-timeout`` seconds, a cancelled question or a closed connection is a
        no; "Allow for this session" keeps a session grant (as the terminal's ``[s]``)."""
        from dsh.tools import approval
        from dsh.tools.grants import matches

        for grant in self.grants:
            if matches(grant, ask):
                return approval.Decision(True, "session", f"granted for this session in the "
                                                          f"editor ({grant['scope']} "
                                                          f"{grant['value']})")
        if self.cancelled or self.server.closing:
            return approval.Decision(False, "editor", "the prompt was cancelled")
        timeout = self.server.permission_timeout
        try:
            future = asyncio.run_coroutine_threadsafe(self._question(ask), self.server.loop)
        except RuntimeError:
            return approval.Decision(False, "editor", "the editor is gone")
        self.pending.add(future)
        if self.cancelled or self.server.closing:  # a cancel that came while it was sent
            future.cancel()
        try:
            answer = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return approval.Decision(False, "editor", f"no answer from the editor within "
                                                      f"{timeout:g} s")
        except concurrent.futures.CancelledError:
            return approval.Decision(False, "editor", "the prompt was cancelled")
        except Exception as exc:  # noqa: BLE001 - a closed connection, a client's error
            return approval.Decision(False, "editor", f"asking the editor failed: "
                                                      f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self.pending.discard(future)
        outcome = answer.outcome
        choice = getattr(outcome, "option_id", None) if outcome.outcome == "selected" else None
        if choice == "allow":
            return approval.Decision(True, "editor", "the person allowed it in the editor")
        if choice == "allow-session":
            scope, value = _always_scope(ask)
            self.grants.append({"tool": ask.tool, "scope": scope, "value": value})
            return approval.Decision(True, "editor", f"the person allowed it for this session "
                                                     f"in the editor ({scope} {value})")
        if outcome.outcome == "cancelled":
            return approval.Decision(False, "editor", "the editor cancelled the question")
        return approval.Decision(False, "editor", "the person rejected it in the editor")

    async def _question(self, ask: Any) -> Any:
        await self.server.outbox.flush()  # the tool call is shown before the question
        call_id = _call_id()
        verb = ask.verb or {"write": "write", "command": "run", "outside": "run",
                            "read": "read"}.get(ask.action, ask.action)
        title = f"{ask.tool} wants to {verb} {ask.subject}"
        if ask.reason:
            title += f" ({ask.reason})"
        content: list[Any] | None = None
        diff = convert.ask_diff(ask)
        if diff is not None:
            content = [diff]
        elif ask.detail:
            content = [schema.ContentToolCallContent(
                type="content", content=schema.TextContentBlock(type="text", text=ask.detail))]
        tool_call = schema.ToolCallUpdate(
            tool_call_id=call_id, title=title[:500], status="pending", content=content,
            kind=convert.tool_kind(ask.tool),  # type: ignore[arg-type]
            raw_input={"tool": ask.tool, "action": ask.action, "subject": ask.subject,
                       "root": ask.root, "reason": ask.reason})
        options = [schema.PermissionOption(option_id=o, name=n, kind=k)  # type: ignore[arg-type]
                   for o, n, k in _OPTIONS]
        return await self.server.conn.request_permission(
            session_id=self.id, tool_call=tool_call, options=options)

    def cancel(self, reason: str = "cancelled by the editor") -> None:
        """``session/cancel``: abort the running turn (once its prompt is recorded), and
        its open questions."""
        if not self.running:
            return
        self.reason = reason
        self.cancelled = True
        if self.ctx is not None and self.taken:
            self.ctx.abort(reason)
        for future in list(self.pending):
            future.cancel()


def _call_id() -> str:
    try:
        from dsh.tools.registry import current_call

        return str(current_call().call.id)
    except LookupError:
        return "dsh-ask-" + os.urandom(4).hex()


def _always_scope(ask: Any) -> tuple[str, str]:
    """What "Allow for this session" grants: the terminal's ``[s]`` scope of this ask."""
    from dsh.tools import approval

    scope = getattr(approval, "_always_scope", None)
    if scope is not None:
        return scope(ask)
    return "command", ask.subject
