"""dsh_timing: wrappers around the two onion chains, reporting to stderr how long they take."""

from __future__ import annotations

import sys
import time
from collections.abc import Generator
from typing import TYPE_CHECKING

from dsh import hookimpl

if TYPE_CHECKING:
    from dsh.llm.builtin import ModelCall
    from dsh.core.messages import ModelResponse
    from dsh.tools.registry import ToolInvocation
    from dsh.tools.registry import ToolOutcome


def report(message: str) -> None:
    print(f"[timing] {message}", file=sys.stderr)


@hookimpl(wrapper=True, tryfirst=True)
def request(call: ModelCall) -> Generator[None, ModelResponse, ModelResponse]:
    """The outermost layer of the chat chain: it times everything inside it."""
    start = time.perf_counter()
    try:
        response = yield  # the inner layers: other wrappers, budget, the model itself
    except Exception as exc:
        report(f"{call.agent}: request failed after {time.perf_counter() - start:.3f}s: {exc}")
        raise  # report, never swallow
    report(f"{call.agent}: model answered in {time.perf_counter() - start:.3f}s")
    return response  # a wrapper returns the result, changed or not


@hookimpl(wrapper=True)
def execute(call: ToolInvocation) -> Generator[None, ToolOutcome, ToolOutcome]:
    """A layer of the tool chain, outside pre_execute and post_execute."""
    report(f"{call.call.name}: start")
    outcome = yield
    report(f"{call.call.name}: {outcome.status} in {outcome.duration_ms or 0:.1f} ms")
    return outcome


@hookimpl
def pre_execute(call: ToolInvocation) -> None:
    report(f"{call.call.name}: pre_execute")


@hookimpl
def post_execute(call: ToolInvocation, outcome: ToolOutcome) -> None:
    report(f"{call.call.name}: post_execute")
