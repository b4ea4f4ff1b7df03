"""Cost everywhere: ``cost`` in ``dsh run --json`` (null without a price), ``dsh run -u``'s
stderr line, ``sessions show`` per turn, per sub-agent (under its call) and in total, ``/cost``
in chat, and :mod:`dsh.run.costs` (the arithmetic over events and over a listing's per-model
usage). Real ``dsh`` subprocesses against a priced loopback server or scripted models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh.core.messages import Usage
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import TurnStarted
from dsh.run.costs import cost_of
from dsh.run.costs import session_cost
from tests import scenario
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion

#: Dollars per million tokens of the loopback model.
PRICE = {"input": 2.0, "output": 10.0}


def lead_cost() -> float:
    inp = sum(i for i, _ in scenario.LEAD_USAGE)
    out = sum(o for _, o in scenario.LEAD_USAGE)
    return (inp * 3.0 + out * 15.0) / 1e6


def helper_cost() -> float:
    inp = sum(i for i, _ in scenario.HELPER_USAGE)
    out = sum(o for _, o in scenario.HELPER_USAGE)
    return (inp * 3.0 + out * 15.0) / 1e6


@pytest.fixture(scope="module")
def priced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The scenario (a lead with tools and a sub-agent, both priced), run once."""
    folder = tmp_path_factory.mktemp("cost")
    scenario.make(folder)
    return folder, scenario.run(folder)


def loopback_env(tmp_path: Path, url: str, price: bool = True) -> dict[str, str]:
    """The config's model on the loopback server: ``openai:gpt-4o-mini`` at :data:`PRICE`,
    or (``price=False``) a model no table prices."""
    config = tmp_path / "dsh.toml"
    model = "openai:gpt-4o-mini" if price else "openai:unpriced-test-model"
    table = f'price = {{ input = {PRICE["input"]}, output = {PRICE["output"]} }}\n' if price else ""
    config.write_text(f'autoload = false\nmodel = "{model}"\n'
                      f'[models."{model}"]\nbase_url = "{url}/v1"\nretries = 0\n' + table)
    e = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    e.update(DSH_CONFIG=str(config), OPENAI_API_KEY="sk-test-0123456789", NO_COLOR="1")
    return e


def dsh(env: dict[str, str], *args: str, input: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", *args], env=env, input=input,
                          capture_output=True, text=True, timeout=60)


# -- dsh run ----------------------------------------------------------------------------------


def test_json_has_the_cost_of_a_priced_model_over_http(tmp_path):
    with ScriptedServer() as server:
        server.script(Reply(body=openai_completion("hello", usage=(1200, 300))))
        proc = dsh(loopback_env(tmp_path, server.url), "run", "--json", "hi")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["usage"] == {"input_tokens": 1200, "output_tokens": 300}
    assert data["cost"] == pytest.approx((1200 * 2.0 + 300 * 10.0) / 1e6)


def test_json_cost_is_null_without_a_price(tmp_path):
    with ScriptedServer() as server:
        server.script(Reply(body=openai_completion("hello", usage=(1200, 300))))
        proc = dsh(loopback_env(tmp_path, server.url, price=False), "run", "--json", "hi")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["usage"]["input_tokens"] == 1200 and data["cost"] is None


def test_usage_flag_prints_one_line_on_stderr(tmp_path):
    with ScriptedServer() as server:
        server.script(Reply(body=openai_completion("hello", usage=(1200, 300))))
        proc = dsh(loopback_env(tmp_path, server.url), "run", "-u", "hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello\n"
    assert proc.stderr.splitlines() == ["dsh: usage: 1200 in / 300 out tokens, $0.005400"]


def test_usage_flag_says_cost_unknown_without_a_price(tmp_path):
    with ScriptedServer() as server:
        server.script(Reply(body=openai_completion("hello", usage=(5, 7))))
        proc = dsh(loopback_env(tmp_path, server.url, price=False), "run", "--usage", "hi")
    assert proc.returncode == 0, proc.stderr
    assert "dsh: usage: 5 in / 7 out tokens, cost unknown" in proc.stderr.splitlines()


def test_json_cost_of_the_scenario(tmp_path):
    scenario.make(tmp_path)
    proc = scenario.dsh(tmp_path, "run", "--json", "read everything")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cost"] == pytest.approx(lead_cost() + helper_cost())


# -- dsh sessions show ------------------------------------------------------------------------


def test_show_has_the_cost_per_turn_per_sub_agent_and_in_total(priced):
    folder, sid = priced
    proc = scenario.dsh(folder, "sessions", "show", sid)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    turn_end = [line for line in out if line.startswith("━━ turn 1 completed")]
    assert len(turn_end) == 1 and turn_end[0].endswith(f"· ${lead_cost():.6f}")
    helper = [line for line in out if "└ sub-agent" in line]
    assert len(helper) == 1
    inp = sum(i for i, _ in scenario.HELPER_USAGE)
    outp = sum(o for _, o in scenario.HELPER_USAGE)
    assert helper[0].endswith(f": {inp} in / {outp} out tokens, ${helper_cost():.6f}")
    # under the parent's call: after the ask_helper call, before the next tool result
    call = next(i for i, line in enumerate(out) if "→ ask_helper" in line)
    result = next(i for i, line in enumerate(out) if line.startswith("TOOL ask_helper"))
    assert call < out.index(helper[0]) < result
    total = next(line for line in out if line.startswith("usage: "))
    assert f"${lead_cost() + helper_cost():.6f}" in total
    assert "(with 1 sub-agent session)" in total


def test_show_says_cost_unknown_for_an_unpriced_model(tmp_path):
    with ScriptedServer() as server:
        # the model the provider reports is priced when the configured one is not: not this
        server.script(Reply(body=openai_completion("hello", usage=(5, 7),
                                                   model="unpriced-test-model-0001")))
        env = loopback_env(tmp_path, server.url, price=False)
        sid = json.loads(dsh(env, "run", "--json", "hi").stdout)["session"]
    out = dsh(env, "sessions", "show", sid).stdout.splitlines()
    assert any(line.startswith("━━ turn 1 completed") and line.endswith("· cost unknown")
               for line in out)
    assert "usage: 5 in / 7 out tokens, cost unknown, 1 response" in out


# -- /cost in chat ----------------------------------------------------------------------------


def test_chat_cost_command_reports_the_session_so_far(tmp_path):
    with ScriptedServer() as server:
        server.script(Reply(body=openai_completion("one", usage=(1000, 100))),
                      Reply(body=openai_completion("two", usage=(2000, 200))))
        env = loopback_env(tmp_path, server.url)
        proc = dsh(env, "chat", input="first\nsecond\n/cost\n")
    assert proc.returncode == 0, proc.stderr
    cost = (3000 * 2.0 + 300 * 10.0) / 1e6
    assert f"3000 in / 300 out tokens, ${cost:.6f}, 2 responses" in proc.stdout + proc.stderr


# -- dsh.run.costs ----------------------------------------------------------------------------


def _prices(model: str) -> tuple[float, float] | None:
    return {"m:priced": (1.0, 2.0), "m:child": (10.0, 20.0)}.get(model)


def _events(model: str, *usages: tuple[int, int], turn: int = 1,
            child: str | None = None) -> list[Any]:
    out: list[Any] = [TurnStarted(turn=turn, agent="a", model=model)]
    for i, o in usages:
        out.append(AssistantMessage(usage=Usage(input_tokens=i, output_tokens=o)))
    if child:
        out.append(ToolCalled(call_id="c1", name="ask_child", child_session=child))
    return out


def test_session_cost_per_turn_per_child_and_in_total():
    events = (_events("m:priced", (1000, 100), child="kid")
              + [TurnStarted(turn=2, agent="a"),  # the model is unchanged: still priced
                 AssistantMessage(usage=Usage(input_tokens=2000, output_tokens=0)),
                 TurnStarted(turn=3, agent="a")])
    kid = _events("m:child", (100, 10))
    found = session_cost(events, _prices, children={"kid": kid}.__getitem__)
    assert found.turns[1].cost == pytest.approx((1000 * 1 + 100 * 2) / 1e6)
    assert found.turns[2].cost == pytest.approx(2000 / 1e6)
    assert found.turns[3].cost is None and found.turns[3].responses == 0
    assert found.own.cost == pytest.approx((3000 * 1 + 100 * 2) / 1e6)
    assert found.children["kid"].total.cost == pytest.approx((100 * 10 + 10 * 20) / 1e6)
    assert found.total.cost == pytest.approx(found.own.cost + (100 * 10 + 10 * 20) / 1e6)
    assert found.total.input_tokens == 3100 and found.total.responses == 3


def test_session_cost_of_an_unpriced_model_is_none_and_counted():
    found = session_cost(_events("m:free", (10, 5)), _prices)
    assert (found.total.cost, found.total.unpriced, found.total.output_tokens) == (None, 1, 5)
    mixed = session_cost(_events("m:priced", (1000, 0)) + _events("m:free", (10, 5), turn=2)[:1]
                         + [AssistantMessage(usage=Usage(input_tokens=10, output_tokens=5))],
                         _prices)
    assert mixed.total.cost == pytest.approx(1000 / 1e6) and mixed.total.unpriced == 1


def test_cost_of_a_listing_usage():
    usage = (("m:priced", 1000, 100, 0, 0), ("m:free", 50, 5, 0, 0), ("m:child", 0, 0, 0, 0))
    assert cost_of(usage, _prices) == pytest.approx((1000 + 200) / 1e6)
    assert cost_of((("m:free", 50, 5, 0, 0),), _prices) is None
    assert cost_of((), _prices) is None
    # cache reads at a tenth of the input price (dsh.run.budget's default multiplier)
    assert cost_of((("m:priced", 1000, 0, 1000, 0),), _prices) == pytest.approx(100 / 1e6)
