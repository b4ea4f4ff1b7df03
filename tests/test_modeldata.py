"""dsh.core.modeldata: the model windows and prices data file (issue 17)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh.core import modeldata
from dsh.core.modeldata import DATA_FILE
from dsh.core.modeldata import ModelFacts
from dsh.core.modeldata import lookup
from dsh.core.modeldata import price_for
from dsh.run.compaction import window_from_table

ROOT = Path(__file__).parent.parent
#: Model ids as the docs write them; the hosted families must also have a price.
MODEL_ID = re.compile(
    r"(?<![\w/.-])((claude|gpt|gemini|deepseek)-[a-z0-9][a-z0-9.-]*[a-z0-9]|o[134](-mini|-pro)?"
    r"|qwen[0-9][a-z0-9.:-]*[a-z0-9]|llama3[0-9.]*[0-9]?|smollm2|mistral|gemma[0-9])(?![\w-])")
HOSTED = ("claude-", "gpt-", "gemini-", "deepseek-chat", "deepseek-reasoner", "o1", "o3", "o4")


def code_in(text: str) -> Iterator[str]:
    """The fenced blocks and the inline code spans of a Markdown text."""
    fences = re.compile(r"^```.*?^```", re.M | re.S)
    yield from (m.group(0) for m in fences.finditer(text))
    yield from re.findall(r"`([^`\n]+)`", fences.sub("", text))


def models_named_in_the_docs() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for code in code_in(path.read_text(encoding="utf-8")):
            for m in MODEL_ID.finditer(code):
                found.setdefault(m.group(1), path.name)
    return found


def test_every_model_named_in_the_docs_has_an_entry() -> None:
    named = models_named_in_the_docs()
    assert {"gpt-4o-mini", "claude-haiku-4-5", "claude-sonnet-4-20250514"} <= set(named)
    for model, where in sorted(named.items()):
        facts = lookup(model)
        assert facts is not None, f"{where} names {model}, which dsh/core/data/models.json lacks"
        assert facts.context_window, f"{model}: no context window"
        if model.startswith(HOSTED):
            assert facts.price is not None and facts.price.pair(), f"{model}: no price"


@pytest.mark.parametrize(("name", "entry"), [
    ("gpt-4o-mini", "gpt-4o-mini"),
    ("openai:gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
    ("gpt-4o", "gpt-4o"),
    ("anthropic:claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
    ("openai:anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),  # OpenRouter's form
    ("claude-sonnet-4-20250514", "claude-sonnet-4"),
    ("claude-opus-4-5", "claude-opus-4-5"),
    ("claude-opus-4-20250514", "claude-opus-4"),
    ("claude-2.1", "claude-"),  # the family's window, no price
    ("o3-mini", "o3-mini"), ("o3", "o3"), ("O3-PRO", "o3-pro"),
    ("qwen2.5:7b", "qwen2.5"), ("openai:qwen2.5:7b", "qwen2.5"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5"),
    ("llama3.1:8b", "llama3.1"), ("llama3:8b", "llama3"),
])
def test_lookup_finds_the_longest_matching_entry(name: str, entry: str) -> None:
    facts = lookup(name)
    assert facts is not None and facts.id == entry


@pytest.mark.parametrize("name", ["echo", "mystery-model", "scripted:/tmp/gpt-4o.json",
                                  "scripted:/data/o3/script.json", "", "local:"])
def test_lookup_of_unknown_names_and_file_paths_is_none(name: str) -> None:
    assert lookup(name) is None


def test_anthropic_entries_have_the_cache_prices_prompt_caching_needs() -> None:
    facts = lookup("claude-sonnet-4-5")
    assert facts is not None and facts.price is not None
    p = facts.price
    assert (p.input, p.output, p.cache_read, p.cache_write, p.cache_write_1h) == (
        3.0, 15.0, 0.3, 3.75, 6.0)
    gpt = lookup("gpt-4o-mini")
    assert gpt is not None and gpt.price is not None
    assert gpt.price.cache_read == 0.075 and gpt.price.cache_write is None  # billed as input


def test_the_data_file_is_consistent() -> None:
    raw = json.loads(Path(DATA_FILE).read_text(encoding="utf-8"))
    assert set(raw) == {"about", "models"}
    names: list[str] = []
    for model_id, entry in raw["models"].items():
        facts = modeldata._facts(model_id, entry)
        names += [model_id, *facts.aliases]
        assert facts.context_window and facts.context_window >= 4096, model_id
        if facts.max_output:
            assert facts.max_output <= facts.context_window, model_id
        if facts.price:
            p = facts.price
            assert p.input and p.output and p.output >= p.input, model_id
            if p.cache_read is not None:
                assert p.cache_read < p.input, model_id
            if p.cache_write is not None:
                assert p.cache_write > p.input, model_id
    assert len(names) == len(set(names)) and all(n == n.lower() for n in names)


def test_an_unknown_key_in_an_entry_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="unknown key.*windw"):
        modeldata._facts("x", {"windw": 5})
    with pytest.raises(ValueError, match="unknown price key.*cached"):
        modeldata._facts("x", {"price": {"cached": 1}})


def test_the_config_price_wins_key_by_key() -> None:
    p = price_for("gpt-4o", {"input": 1.0})
    assert p is not None and (p.input, p.output, p.cache_read) == (1.0, 10.0, 1.25)
    assert price_for("mystery", {"input": 1, "output": 2}) is not None
    assert price_for("mystery", None) is None


def test_the_file_is_not_read_when_the_config_gives_the_price() -> None:
    modeldata.table.cache_clear()
    p = price_for("gpt-4o", {"input": 1, "output": 2, "cache_read": 0.5})
    assert p is not None and p.pair() == (1.0, 2.0) and p.cache_read == 0.5
    assert modeldata.table.cache_info().misses == 0
    assert lookup("gpt-4o") is not None and modeldata.table.cache_info().misses == 1


def test_compaction_windows_come_from_the_data_file() -> None:
    assert window_from_table("anthropic:claude-sonnet-4-5") == 200_000
    assert window_from_table("gpt-4.1-mini") == 1_047_576
    assert window_from_table("smollm2") == 8_192
    assert window_from_table("mystery") is None


def test_the_data_file_is_package_data() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = conf["tool"]["setuptools"]["package-data"]["dsh.core"]
    rel = Path(DATA_FILE).relative_to(ROOT / "dsh" / "core")
    assert any(rel.match(p) for p in patterns)


@given(st.text(max_size=60))
def test_lookup_never_fails_and_finds_an_entry_the_name_starts_with(name: str) -> None:
    facts = lookup(name)
    if facts is not None:
        assert isinstance(facts, ModelFacts)
        assert any(form.startswith(n) for form in modeldata.candidates(name)
                   for n in (facts.id, *facts.aliases))


def test_help_and_a_fully_configured_run_do_not_read_the_data_file(tmp_path: Path) -> None:
    config = tmp_path / "dsh.toml"
    config.write_text('model = "echo"\n[models.echo]\ncontext_window = 4096\n'
                      'price = { input = 0.1, output = 0.2 }\n')
    code = ("import atexit, sys\n"
            "def report():\n"
            "    m = sys.modules.get('dsh.core.modeldata')\n"  # imported is fine; read is not
            "    sys.stderr.write('LOADED %s\\n' % bool(m and m.table.cache_info().misses))\n"
            "atexit.register(report)\n"
            "from dsh.cli.root import main\nsys.argv = ['dsh'] + sys.argv[1:]\nmain()\n")
    env = {**os.environ, "DSH_HOME": str(tmp_path)}

    def loaded(*args: str) -> bool:
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        return "LOADED True" in r.stderr

    assert not loaded("--help")
    assert not loaded("--config", str(config), "run", "hi")
    # A model with no configured price is priced from the file.
    assert loaded("run", "-m", "echo", "-L", "cost=1", "hi")
