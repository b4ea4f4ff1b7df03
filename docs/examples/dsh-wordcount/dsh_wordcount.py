"""dsh-wordcount: a tool, a prompt fragment and a pre_step guard — a complete dsh plugin."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from dsh import hookimpl
from dsh.core.errors import ConfigError
from dsh.core.errors import ToolError

if TYPE_CHECKING:
    from dsh.run.loop import StepDraft
    from dsh.host.scope import AgentInfo

WORD = re.compile(r"[^\W_]+(?:['-][^\W_]+)*")
#: Something that looks like an API key: "sk-" and at least 20 more key characters.
SECRET = re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")


@hookimpl
def register_tools(register: Callable[..., None], agent: AgentInfo) -> None:
    """Give the agent ``count_words``, configured by ``[plugins.wordcount]``."""
    top = agent.plugin_settings("wordcount").get("top", 3)
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ConfigError(f"[plugins.wordcount] top: expected a positive integer, got {top!r}")

    def count_words(text: str, ignore_case: bool = True) -> dict[str, Any]:
        """Count the words of a text and name the most frequent ones.

        :param text: the text to count.
        :param ignore_case: count "The" and "the" as the same word.
        """
        words = WORD.findall(text.lower() if ignore_case else text)
        if not words:
            raise ToolError("the text contains no words")
        return {
            "words": len(words),
            "distinct": len(set(words)),
            "most_common": Counter(words).most_common(top),
        }

    register(count_words)


@hookimpl
def register_prompt(register: Callable[..., None]) -> None:
    register("To count words, call count_words; never count by hand.", name="wordcount")


@hookimpl
def pre_step(step: StepDraft) -> None:
    """Redact API keys from the user's message before anything of the step is logged."""
    if SECRET.search(step.text):
        step.text = SECRET.sub("[redacted API key]", step.text)
