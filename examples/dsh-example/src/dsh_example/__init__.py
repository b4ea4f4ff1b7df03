"""dsh-example: a complete dsh plugin (docs/plugin-examples.md).

For each agent that enables it (``plugins = ["example"]``):

- ``pre_step`` expands shorthands in the user's message and refuses a message with a
  blocked word;
- ``post_execute`` redacts API keys from tool results;
- a ``request`` wrapper counts the session's model requests, in the session stash and in
  the session's ledger (a plugin event), so the count survives a restart;
- ``turn_stopping`` asks the model to review its answer, once per turn;
- the tool ``request_count`` tells the model the count.

Settings, in ``[plugins.example]``, overridden per agent in
``[agents.NAME.plugin_settings.example]``: ``shorthands`` (a table: word = replacement),
``blocked`` (a list of words), ``review`` (the follow-up message; empty: no review).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Generator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from dsh import StashKey
from dsh import hookimpl
from dsh.core.errors import ConfigError

if TYPE_CHECKING:
    from dsh import AgentHandle
    from dsh.core.messages import ModelResponse
    from dsh.llm.builtin import ModelCall
    from dsh.run.loop import StepDraft
    from dsh.run.loop import Turn
    from dsh.tools.registry import ToolInvocation
    from dsh.tools.registry import ToolOutcome

#: The plugin's name: its entry point's name, the key of its settings, the PLUGIN of its
#: events (x/example/NAME).
PLUGIN = "example"
WORD = re.compile(r"[^\W_]+(?:['-][^\W_]+)*")
#: Shapes of well-known API keys (OpenAI-style, GitHub, AWS access key ids).
API_KEY = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}|\bghp_[A-Za-z0-9]{36}\b"
                     r"|\bAKIA[0-9A-Z]{16}\b")


@dataclass(frozen=True)
class Settings:
    """The plugin's settings for one agent, checked."""

    shorthands: Mapping[str, str]
    blocked: frozenset[str]
    review: str

    @classmethod
    def parse(cls, table: Mapping[str, Any]) -> Settings:
        unknown = sorted(set(table) - {"shorthands", "blocked", "review"})
        if unknown:
            raise ConfigError(f"[plugins.{PLUGIN}]: unknown key {unknown[0]!r} "
                              "(known: blocked, review, shorthands)")
        shorthands = table.get("shorthands", {})
        if not isinstance(shorthands, Mapping) or not all(
                isinstance(v, str) for v in shorthands.values()):
            raise ConfigError(f"[plugins.{PLUGIN}] shorthands: expected a table of strings, "
                              f"got {shorthands!r}")
        blocked = table.get("blocked", [])
        if not isinstance(blocked, list) or not all(isinstance(w, str) for w in blocked):
            raise ConfigError(f"[plugins.{PLUGIN}] blocked: expected a list of words, "
                              f"got {blocked!r}")
        review = table.get("review", "")
        if not isinstance(review, str):
            raise ConfigError(f"[plugins.{PLUGIN}] review: expected a string, got {review!r}")
        return cls({k.lower(): v for k, v in shorthands.items()},
                   frozenset(w.lower() for w in blocked), review.strip())


#: Typed keys of the stashes: one per piece of state, made once.
SETTINGS = StashKey[Settings]()
REQUESTS = StashKey[int]()


def settings(agent: AgentHandle) -> Settings:
    """This agent's settings, checked once and kept in the agent's stash."""
    found = agent.stash.get(SETTINGS, None)
    if found is None:
        found = agent.stash.setdefault(SETTINGS, Settings.parse(agent.plugin_settings(PLUGIN)))
    return found


@hookimpl
def register_tools(register: Callable[..., None], agent: AgentHandle) -> None:
    settings(agent)  # a bad setting is a ConfigError now, before any model is called

    def request_count() -> int:
        """How many requests this session has sent to the model, this one included."""
        return agent.session_stash.get(REQUESTS, 0)

    register(request_count)


@hookimpl
def pre_step(step: StepDraft) -> None:
    """Refuse a message with a blocked word; expand shorthands in the others."""
    if step.source != "user" or not step.text:
        return  # our own review follow-up (source "plugin:example"), or tool results only
    rules = settings(step.handle)
    words = {w.lower() for w in WORD.findall(step.text)}
    blocked = sorted(words & rules.blocked)
    if blocked:
        step.reject(f"the message contains the blocked word {blocked[0]!r}")
        return
    if words & rules.shorthands.keys():
        step.text = WORD.sub(lambda m: rules.shorthands.get(m[0].lower(), m[0]), step.text)


@hookimpl
def post_execute(call: ToolInvocation, outcome: ToolOutcome) -> None:
    """Redact API keys from every tool's result before it is logged and read."""
    if API_KEY.search(outcome.output):
        outcome.output = API_KEY.sub("[redacted key]", outcome.output)


@hookimpl(wrapper=True)
def request(call: ModelCall) -> Generator[None, ModelResponse, ModelResponse]:
    """Count the session's requests: in its stash, and as the event x/example/requests."""
    agent = call.handle
    count = agent.session_stash.get(REQUESTS, None)
    if count is None:  # the first request of this Session object: resume from the ledger
        previous = agent.plugin_events(PLUGIN, "requests")
        count = previous[-1].data["count"] if previous else 0
    agent.session_stash[REQUESTS] = count + 1
    agent.record_event(PLUGIN, "requests", {"count": count + 1})
    response = yield
    return response


@hookimpl
def turn_stopping(turn: Turn) -> str | None:
    """Ask for one more step, once per turn: the model reviews its answer."""
    review = settings(turn.handle).review
    if review and turn.stopping_calls == 1 and turn.response is not None:
        return review
    return None
