"""Every hook dsh calls, in lifecycle order. Each docstring is the hook's contract, and
docs/hooks.md is checked against these signatures by tests/test_docs.py.

Hooks are called with keyword arguments only. An implementation may accept any subset of a
spec's arguments (pluggy passes only those it names), which is why specs only ever *gain*
arguments. Implementations must not give their parameters defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable

    import click

    from dsh.core.messages import ModelResponse
    from dsh.host.scope import AgentHandle
    from dsh.llm.builtin import ModelCall
    from dsh.run.app import App
    from dsh.run.compaction import Compaction
    from dsh.run.compaction import CompactionRequest
    from dsh.run.loop import StepDraft
    from dsh.run.loop import Turn
    from dsh.tools.registry import ToolInvocation
    from dsh.tools.registry import ToolOutcome

hookspec = pluggy.HookspecMarker("dsh")
hookimpl = pluggy.HookimplMarker("dsh")


# --------------------------------------------------------------------------------------------
# Assembly: once per process / per agent, no I/O
# --------------------------------------------------------------------------------------------


@hookspec(historic=True)
def configure(app: App, pm: pluggy.PluginManager) -> None:
    """Called when a plugin manager is assembled, after every plugin is registered: once on
    the app-wide manager and once on each agent's own manager (an agent with an explicit
    ``plugins`` list; agents using every installed plugin share the app-wide manager), always
    with the same ``app``. Keep it idempotent.

    :param app: the assembled :class:`dsh.App`; ``app.config.plugin_settings(name)`` returns
        the ``[plugins.NAME]`` table of the config.
    :param pm: the plugin manager being configured (take it only if you need it). A plugin
        may register a helper object in it, e.g. an ``observe_event`` observer only when its
        settings enable it, so that an installed but disabled plugin leaves runs unobserved
        (D7; dsh-otel does this). Register it under a name of your own, once per manager.

    Historic: a plugin registered later still receives the call. Cannot be wrapped.

    **Use in plugins:** prepare what the settings say (declare them with
    :func:`declare_settings` and dsh validates them first; read them with ``dsh.settings``);
    raise :class:`dsh.ConfigError` for a bad value only you can judge. Do no I/O here
    (MISSION D1).

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 ``pm``.
    """


@hookspec(firstresult=True)
def agent_plugins(agent: AgentHandle, installed: list[str]) -> list[str] | None:
    """Decide which installed (non built-in) plugins take part in ``agent``'s scope (A6).

    :param agent: the :class:`dsh.AgentHandle` of the agent being assembled (name, model,
        settings).
    :param installed: the names of every installed plugin, in load order.
    :return: firstresult: the first non-None list of plugin names wins.

    The built-in implementation (``dsh.scope``, ``trylast``) returns the agent's explicit
    ``plugins`` list from the config, or every installed plugin when it has none. Called on the
    app-wide plugin manager.

    **Use in plugins:** implement it to impose another scoping policy (for example by tag).

    .. versionadded:: 0.1
    """


@hookspec
def declare_settings() -> type | None:
    """Declare the settings of this plugin: return the attrs class of its ``[plugins.NAME]``
    table (``NAME``: the plugin's registered name), or None.

    dsh validates the table, and each agent's ``[agents.A.plugin_settings.NAME]`` overlaid
    on it key by key, when a plugin manager is configured (``App.pm``, ``dsh config
    validate``, every run) with the config's own rules: an unknown key is refused with the
    nearest valid name, a wrong type names the key path and the expected type (a
    :class:`dsh.ConfigError`, exit code 2). Fields with defaults are optional keys; a
    nested attrs class is a sub-table.

    **Use in plugins:** declare a frozen class (``@attrs.frozen``) and read the validated
    instance with ``dsh.settings(TheClass, agent)`` (cached per agent), instead of
    validating ``agent.plugin_settings(NAME)`` by hand::

        @attrs.frozen
        class NotesSettings:
            max_notes: int = 50

        @dsh.hookimpl
        def declare_settings():
            return NotesSettings

    .. versionadded:: 0.5
    """


@hookspec
def register_models(register: Callable[..., None]) -> None:
    """Register model adapters.

    :param register: ``register(prefix, factory, description="", models=None)``.
        ``factory(name, settings)`` returns a :class:`dsh.llm.base.Model`; it may be a
        ``"module:attr"`` string so the adapter module is imported only when used. The id
        ``"PREFIX:NAME"`` selects it. ``models``, optional: a callable (or a ``"module:attr"``
        string) returning ``[{"id": "PREFIX:NAME", "plugin": …}, …]``, the models this
        prefix serves, for ``dsh models`` to list (called only by that listing; dsh-llm lists
        the models of installed llm plugins this way). Without it the prefix takes any name.

    Called on the app-wide plugin manager: models are app-wide, not per agent. A later
    registration of the same prefix is an error naming both plugins.

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 ``models``.
    """


@hookspec
def register_tools(register: Callable[..., None], agent: AgentHandle) -> None:
    """Register tools for ``agent``.

    :param register: ``register(fn, *, name=None, description=None, sequential=False,
        timeout=None, parameters=None, validator=None)``. ``fn`` is a plain Python function;
        its JSON Schema comes from its type hints and its description from the docstring
        (``:param x:`` or ``Args:`` sections). A function decorated with :func:`dsh.tool`
        carries its own options. ``parameters`` gives the schema instead (``fn`` takes
        ``**kwargs``), ``validator(arguments) -> list of problems`` checks the arguments
        instead of :func:`dsh.tools.registry.validate` (dsh-mcp: whole JSON Schema).
    :param agent: the :class:`dsh.AgentHandle` of the agent whose scope is being assembled
        (``agent.plugin_settings(NAME)``, ``agent.stash``); the same object the agent's other
        hooks reach as ``.handle``.

    Called once per agent at assembly, on that agent's plugin manager, so a tool registered by
    a plugin the agent does not enable never reaches it. A duplicate name is an error naming
    both plugins.

    .. versionadded:: 0.1
    """


@hookspec
def register_prompt(register: Callable[..., None], agent: AgentHandle) -> None:
    """Register fragments of the system prompt.

    :param register: ``register(text, *, order=100, name=None)``. Fragments are stitched after
        the agent's own ``system`` text, by ascending ``order``, then by registration order,
        separated by blank lines. Provenance (plugin, name, order) is kept for ``dsh agents``.
    :param agent: the :class:`dsh.AgentHandle` of the agent whose scope is being assembled.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def system_prompt(agent: AgentHandle, system: str, parts: tuple[Any, ...]) -> str | None:
    """Make the agent's system prompt from its fragments (MISSION A4).

    :param agent: the :class:`dsh.AgentHandle` of the agent being assembled.
    :param system: the agent's own ``system`` text (``""`` when it has none).
    :param parts: every fragment registered through ``register_prompt``, the agent's own text
        first, as ``PromptPart(text, plugin, name, order)`` in registration order.
    :return: firstresult: the system prompt (a ``str``); it is recorded on ``turn/start``
        and what is sent is what the ledger line holds (C3).

    The built-in ``dsh.prompt`` (``trylast``) stitches the fragments by ascending ``order``,
    separated by blank lines. ``disable = ["dsh.prompt"]`` plus a plugin's own
    implementation replaces the stitching; disabled with nothing in its place, the prompt is
    the agent's own ``system`` text alone (no fragment is stitched).

    .. versionadded:: 0.3
    """


@hookspec
def turn_prompt(register: Callable[..., None], agent: AgentHandle, session: Any) -> None:
    """Add fragments to the system prompt of the turn about to start, from recorded state.

    :param register: ``register(text, *, order=100, name=None)``, as in
        :func:`register_prompt`; these fragments come after the agent's whole assembled
        system prompt, by ascending ``order`` then registration order.
    :param agent: the :class:`dsh.AgentHandle` of the agent running the turn.
    :param session: the :class:`dsh.run.session.Session` (``session.state(KEY)`` reads
        recorded state, ``session.update_state(KEY, data)`` records an update, such as the
        content of a file read now, before the turn starts).

    Called once at the start of every turn, before ``turn/start`` is written: the system prompt
    the turn records (when it changed) is the agent's plus these fragments, so what they add
    reaches the model only through the ledger (C3), and a resumed session in a new process
    builds the same text from the same events. It must depend only on recorded state (and
    what it records now): the built-in ``dsh.memory`` and ``dsh.tasks`` show the session's
    memory, then its task list, this way (MISSION D4: system, memory, tasks, history).
    Within a turn the text does not change; the tool that changes the state answers with the
    new value.

    .. versionadded:: 0.3
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add commands to the ``dsh`` command line.

    :param cli: the root :class:`click.Group`; call ``cli.add_command(...)``.

    Called only when a command that is not built in is looked up, so ``dsh --help`` and
    ``dsh --version`` load no plugin. Import heavy modules inside the command, not at import.

    .. versionadded:: 0.1
    """


@hookspec
def register_agents(register: Callable[..., None], app: App) -> None:
    """Provide agent definitions, as if they were ``[agents.NAME]`` tables of the config.

    :param register: ``register(name, settings, *, source="")``: ``settings`` holds the keys
        of an ``[agents.NAME]`` table (``system``, ``model``, ``tools``, ``description``,
        ``subagents``, …) and is validated as one (a bad key is a ConfigError naming
        ``source``, e.g. the file the agent came from). ``model = "inherit"`` makes a
        sub-agent use its parent's model (the default model when run on its own).
    :param app: the :class:`dsh.App` (``app.config.plugin_settings(NAME)``).

    Called once, on the app-wide plugin manager, right after ``configure``. The config's own
    ``[agents.NAME]`` wins a collision, and so does the first plugin to register a name; each
    ignored definition is reported as a note (``dsh: note: …`` on stderr). The merged agents
    are usable as ``dsh run -a NAME`` and in ``subagents = [...]``.

    .. versionadded:: 0.3
    """


@hookspec(firstresult=True)
def expand_command(name: str, arguments: str, agent: AgentHandle) -> Any:
    """Expand a prompt that starts with ``/NAME ARGS…`` (``dsh run``, a ``dsh chat``
    message) into the prompt to send.

    :param name: the command's name, without the ``/`` (``review``, ``ns:name``).
    :param arguments: the rest of the prompt, stripped (``""`` when none).
    :param agent: the :class:`dsh.AgentHandle` of the agent that will run it (settings, its
        sandbox policy through :func:`dsh.sandbox.policy_for`).
    :return: firstresult: the prompt (a ``str``), or a
        :class:`dsh.run.commands.CommandExpansion` (``prompt``, and ``model`` / ``tools`` to
        use for the run), or None when the name is not yours.

    The expanded prompt is what is sent and recorded as the ``user/message`` (C3); the
    command line itself is not recorded. A name no plugin knows is a usage error (exit 2),
    never sent as text; ``//text`` sends ``/text``, and a first word with another ``/`` in
    it (``/etc/hosts …``) is text. In ``dsh chat`` a built-in or plugin chat command of the
    same name wins. Called on the agent's own plugin manager.

    .. versionadded:: 0.3
    """


@hookspec
def list_commands(agent: AgentHandle) -> dict[str, str] | None:
    """Name the ``/`` commands ``expand_command`` knows, for listings and error messages.

    :param agent: the :class:`dsh.AgentHandle`.
    :return: ``{name: description}`` (or None).

    .. versionadded:: 0.3
    """


@hookspec(firstresult=True)
def default_model() -> tuple[str, str] | None:
    """Offer a model to a user who configured none and has no provider key in the
    environment (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``).

    :return: firstresult: ``(model id, why)`` — e.g. ``("local", "dsh-llama and a model file
        are installed")`` — or None. Without any offer, dsh uses the offline ``echo`` model
        and says so on stderr.

    **Use in plugins:** answer only when the model can really run here (files installed),
    cheaply: no model loading, no network.

    .. versionadded:: 0.2
    """


@hookspec
def register_chat_commands(register: Callable[..., None]) -> None:
    """Add ``/`` commands to ``dsh chat``.

    :param register: call ``register(name, fn, help="", during_turn=False)`` for each
        command. ``fn(chat, argument)`` receives the :class:`dsh.cli.repl.Chat` (its ``session``,
        ``app``, ``note(text)`` for a line on stderr, ``set_agent(**overrides)`` to switch
        model, system prompt or tools from the next message on) and the text after the
        command's name; it may return text to print. ``during_turn=True`` lets the command be
        typed while a turn runs (it is then called from the thread that reads the terminal:
        it must not wait for the turn). A name registered twice is an error naming both
        plugins.

    Called when a chat starts, with the chat agent's plugins.

    .. versionadded:: 0.2
    """


@hookspec(firstresult=True)
def session_store(app: App) -> Any:
    """Provide the session store (the ledger backend).

    :param app: the app being assembled.
    :return: firstresult: an object with the interface of :class:`dsh.ledger.store.JsonlStore`.

    The built-in JSON Lines store (``dsh.ledger``) is ``trylast``: a plugin returning another
    store (SQLite, PostgreSQL) replaces it. A store that keeps attachments (issue 17) also has
    ``put_attachment(data) -> sha256`` and ``get_attachment(sha256) -> bytes``; dsh checks
    every byte against the hash (docs/attachments.md). Without them, attaching is refused.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def batch_executor(name: str, app: App) -> Any:
    """Provide the executor ``dsh batch --executor NAME`` runs its tasks with.

    :param name: the executor asked for (``local`` unless ``--executor`` says otherwise).
    :param app: the app running the batch; it owns the session store, the results and the
        batch's shared budget, so whatever runs elsewhere reports back to it.
    :return: firstresult: an object with the interface of :class:`dsh.batch.executors.Executor` —
        ``run(job, tasks, *, workers)`` calls ``job(task)`` for each task (at most
        ``workers`` at once, taking the next task only when a slot is free) and yields each
        return value as it finishes; ``close()`` — or None when ``name`` is not yours.

    When no plugin answers for ``local``, the built-in executor runs the tasks in threads
    of this process (:class:`dsh.batch.executors.LocalExecutor`); answering for ``local``
    replaces it.

    **Use in plugins:** answer only for your own name, and import your heavy dependencies
    inside the hook, after checking the name (``dsh batch`` without ``--executor`` must not
    import them). Called once per batch, on the app-wide plugin manager.

    .. versionadded:: 0.2
    """


# --------------------------------------------------------------------------------------------
# A turn and its steps
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def run_turn(turn: Turn) -> str | None:
    """Drive one turn: take input from the inbox, run steps until no work is due (A1, B2).

    :param turn: the turn's state: ``agent``, ``session``, ``ledger``, ``pm``, ``inbox``.
    :return: firstresult: the turn's outcome (``completed``, ``rejected``, ``stopped``,
        ``budget``); the driver writes ``turn/end`` itself.

    The built-in driver (``dsh.loop``, ``trylast``) is the agent loop. Replacing it replaces
    the whole step (MISSION D10); it must keep writing the events of docs/events.md.

    .. versionadded:: 0.1
    """


@hookspec
def pre_step(step: StepDraft) -> None:
    """Inspect, rewrite or reject what the next step will send (``agent/pre-step``, B4).

    :param step: the draft: ``step.text`` (the user message, mutable; ``""`` on a step that
        only carries tool results), ``step.context`` (injected context items, mutable list),
        ``step.messages`` (the history so far, read only), ``step.index``, ``step.agent``
        (the agent's name), ``step.source`` (``user``, or ``plugin:NAME`` for a follow-up
        from ``turn_stopping``), ``step.handle`` (the :class:`dsh.AgentHandle`:
        ``step.handle.plugin_settings(NAME)`` gives a plugin its settings for this agent,
        ``.stash`` / ``.session_stash`` / ``.run_stash`` its state) and ``step.turn`` (the
        :class:`dsh.run.loop.Turn` it belongs to: ``turn.number``, ``turn.ctx``; ``None`` only
        for a draft built outside the loop). Call ``step.reject(reason)`` to refuse it.

    Called before every step, before anything of the step is written to the ledger, so a
    rewrite is what gets logged (C3) — also before the step of a continuation message (a
    follow-up a ``turn_stopping`` implementation asked for, ``step.source`` names it) and of
    a message steered in during the turn. Text that is empty or only whitespace (what
    ``str.strip()`` removes) is no message: no step is attempted for it, so this is not
    called, and injected context alone waits in the inbox for a real message (B3).

    A rejection, or a message rewritten to empty or whitespace, writes ``step/rejected`` and
    closes the turn like any other: ``turn_stopping`` is asked (a follow-up it gives gets a
    step), else the outcome is ``rejected``; context injected before the rejected step stays
    in the inbox for the next one (B4, issue 23). The event names the plugin that did it — its
    registered name, found by the loop, never a name the plugin passes (``reject``'s old
    ``plugin=`` argument is ignored). Implementations are called one at a time, in pluggy's
    order (last registered first, ``tryfirst`` before, ``trylast`` after); the first
    rejection wins and later implementations are not called.

    Cannot be wrapped (calling implementations one by one is what attributes a rejection): a
    ``wrapper=True`` implementation ends the turn with an error naming its plugin.

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 ``step.turn`` (dsh-hooks reads its per-agent settings there).
    .. versionchanged:: 0.2 ``step.handle``.
    .. versionchanged:: 0.3 a rejected turn asks ``turn_stopping``; its context is kept.
    """


@hookspec(firstresult=True)
def request(call: ModelCall) -> ModelResponse | None:
    """The chat chain: send ``call.request`` to the model (``agent/request``).

    :param call: ``call.request`` (a deeply frozen :class:`dsh.core.messages.ModelRequest`),
        ``call.model`` (the agent's adapter), ``call.agent`` (its name), ``call.handle``
        (the :class:`dsh.AgentHandle`: settings and stashes), ``call.on_text``.
    :return: firstresult: the :class:`dsh.core.messages.ModelResponse`.

    The built-in implementation (``dsh.llm.builtin``, ``trylast``) hands the request to
    ``dsh.llm.transport.send`` — which checks invariant C3 against the session's record, reserves
    the request in the budget and calls the recorded adapter — and rescues tool calls written
    as text (D5). Around it, outermost first: plugin wrappers, then the built-in wrappers
    ``dsh.budget`` (tokens and cost) and ``dsh.recorder`` (the live ``agent/request`` event).

    **Use in plugins:** wrappers are welcome (``@hookimpl(wrapper=True)``), with exactly one
    ``yield``: code before it sees the request, ``response = yield`` runs the inner layers,
    return the response. To change the request, swap it:
    ``call.request = attrs.evolve(call.request, …)`` — but what the model sees must be written
    to the ledger first, or the transport refuses to send it (the turn ends with outcome
    ``error``, naming your plugin). Replacing the built-in implementation does not skip the
    check: adapters refuse requests that did not come through the transport, and so does
    a different adapter put on ``call.model``.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def execute(call: ToolInvocation) -> ToolOutcome | None:
    """The tool chain: run one tool call.

    :param call: ``call.call`` (the model's :class:`dsh.core.messages.ToolCall`), ``call.tool``
        (the registered tool, or None if unknown), ``call.arguments`` (mutable),
        ``call.handle`` (the :class:`dsh.AgentHandle`: settings and stashes).
    :return: firstresult: the :class:`dsh.tools.registry.ToolOutcome`.

    The built-in implementation (``dsh.tools``, ``trylast``) validates the arguments against
    the schema and calls the function; exceptions and timeouts become error outcomes. The
    built-in wrapper ``dsh.tools.registry.dispatch`` calls :func:`pre_execute` and
    :func:`post_execute`.

    **Use in plugins:** wrappers are welcome; they run in the tool's worker thread, inside the
    run's context.

    .. versionadded:: 0.1
    """


@hookspec
def pre_execute(call: ToolInvocation) -> None:
    """Inspect, rewrite or block a tool call before it runs (``tools/pre-execute``).

    :param call: change ``call.arguments`` to rewrite; ``call.block(reason)`` to refuse: the
        model then receives the error result ``tool call blocked by PLUGIN: reason``.

    The rules (docs/plugin-hooks.md, "pre_execute: the rules"): **every implementation runs**,
    also after one has blocked the call, one at a time in pluggy's order (``tryfirst`` ones,
    then the last registered first, then ``trylast`` ones). ``call.blocked`` and
    ``call.blocked_by`` show the first block to the implementations after it; the blocking
    plugin is named from its registration, as ``step.reject`` is (the ``plugin`` argument of
    ``block`` is ignored here). A second ``block`` is added to ``call.blocks`` and changes
    nothing else: the first decides. A wrapper implementation is refused (wrap ``execute``).

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 every implementation runs; the blocking plugin is the registered one.
    """


@hookspec
def post_execute(call: ToolInvocation, outcome: ToolOutcome) -> None:
    """Inspect or rewrite a tool's result before it is logged (``tools/post-execute``).

    :param call: the invocation.
    :param outcome: mutable: ``outcome.output`` (text the model will read) and
        ``outcome.status`` (``ok`` or ``error``).

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def turn_stopping(turn: Turn) -> str | None:
    """No work is due and the turn is about to close (``agent/turn-stopping``, B2).

    :param turn: the turn's state; ``turn.response`` is the final
        :class:`dsh.core.messages.ModelResponse` of the turn (``text``, ``tool_calls``,
        ``usage``, ``reasoning``; None when no step ran), ``turn.stopping_calls`` how many
        times this hook has been called in this turn (1 on the first call),
        ``turn.continuations`` and ``turn.max_continuations`` say whether an answer can still
        be taken, ``turn.steps`` how many steps ran (0 when the turn's input was empty),
        ``turn.handle`` is the :class:`dsh.AgentHandle`, ``turn.session`` the
        :class:`dsh.run.session.Session`.
    :return: firstresult: a message to continue the turn with one more step (it is written to
        the ledger as a ``user/message`` whose ``source`` names the plugin), or None to let the
        turn close. The first implementation that answers wins and the others are not called
        this time; all are called again at the next stop (after the follow-up's step), in
        the same order, so several plugins each get their follow-up in, one stop at a time,
        as long as each answers only once (an implementation that answers at every stop keeps
        the ones after it from answering: count your answers in ``turn.handle.run_stash``).

    Called every time the turn is about to stop because no work is due — also when
    ``max_continuations`` is 0 or used up, so an observer or a plugin checking the result
    sees every stop. Past the bound (``max_continuations``, default 3, per turn) an answer is
    not taken: the turn closes with outcome ``completed`` and ``turn/end``'s reason says
    ``continuation limit reached (N): the follow-up from plugin:NAME was not taken``.
    Also called when ``pre_step`` rejected the step (issue 23). Not called when the turn
    ends another way (``budget``, ``stopped``, ``aborted``, ``error``). A user message
    steered in while the hook runs (``Session.steer``) still gets its step, after a
    follow-up taken here.

    Cannot be wrapped: implementations are called one at a time, to record which one
    answered; a ``wrapper=True`` implementation ends the turn with an error naming its plugin.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def compact_context(request: CompactionRequest) -> Compaction | None:
    """Propose how to shrink a session's history that no longer fits its model's window.

    Called before a request estimated above ``compact_at`` of the window (``reason``
    ``threshold``), after a provider's context-length error (``provider``; the request is
    retried once), and by ``dsh sessions compact`` (``manual``). What is returned is recorded
    as a ``context/compacted`` event *before* it takes effect, so the projection, a resumed
    session and the C3 check all see it; the original events stay in the ledger.

    :param request: a :class:`dsh.run.compaction.CompactionRequest`: ``agent``, ``handle`` (the
        :class:`dsh.AgentHandle`), ``messages`` (the projected history, read-only),
        ``window`` and ``used`` (tokens), ``target`` (tokens to get under), ``reason``,
        ``strategy`` (the agent's ``compaction`` setting), and
        ``estimate(messages)`` for a conservative token count.
    :return: firstresult: a :class:`dsh.run.compaction.Compaction` replacing
        ``messages[start:end]`` by ``replacement`` (with the name of its ``strategy``), or
        None to leave the history as it is. The built-in implementation (``trylast``) knows
        ``auto``, ``mask`` and ``summarize``; a plugin providing its own strategy answers
        when ``request.strategy`` is its name.

    Wrappers are welcome: return None from a wrapper to veto a compaction, change the result
    to adjust it, or just look at it (this is where Claude Code's ``PreCompact`` maps).

    **Use in plugins:** keep tool calls and their results together (replace whole steps, or
    only change contents); a summariser should make its model call in a recorded sub-run,
    as the built-in one does (:func:`dsh.run.compaction.write_summary`).

    .. versionadded:: 0.2
    """


# --------------------------------------------------------------------------------------------
# Observation
# --------------------------------------------------------------------------------------------


@hookspec
def observe_event(event: Any) -> None:
    """Receive live events (observers, MISSION C2 and D7).

    :param event: a persistent :class:`dsh.ledger.events.Event` as it is written, or a
        :class:`dsh.run.recorder.LiveEvent` (``agent/pre-step``, ``agent/request``,
        ``llm/stream``, ``llm/reasoning``, ``tools/pre-execute``, ``tools/post-execute``,
        ``agent/turn-stopping``).

    Implementing this hook makes every run of the agent *observed*: live events are built and
    providers stream. Unobserved runs build none (D7). Must be fast and must not raise.
    Calls are serialised (one event at a time), although ``tools/*`` events of concurrent tool
    calls come from their worker threads.

    .. versionadded:: 0.1
    """
