"""``dsh config set`` / ``unset`` edit the file in place (tomlkit): every comment, blank line
and key order is kept and only the changed key's line differs; a new key goes after the last
key of its table, a new table at the end; commented-out starter lines stay comments. The
write stays atomic, keeps the mode, and a file that is not TOML is refused naming its line.

Real ``dsh`` processes, with the config in the isolated ``$XDG_CONFIG_HOME`` of conftest.py.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.edit import STARTER
from dsh.config.edit import set_value
from dsh.config.edit import unset_value
from dsh.config.loader import load_config
from dsh.core.errors import DshError

DSH = [sys.executable, "-m", "dsh"]


def dsh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], capture_output=True, text=True, timeout=120)


def config_file() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "dsh" / "config.toml"


def comments(text: str) -> list[str]:
    """Every comment of ``text``, whole-line and trailing, in order (of a file whose values
    hold no ``#``)."""
    return [m.group(0).rstrip() for m in re.finditer(r"#[^\n]*", text)]


def kept_in_order(original: str, text: str) -> bool:
    """Every comment of ``original`` is in ``text``, in the same order, on a line of its own
    when it was one (``text``'s values may hold a ``#``)."""
    pos, text = 0, "\n" + text
    for line in original.splitlines():
        if "#" not in line:
            continue
        comment = line[line.index("#"):]
        whole = line.lstrip().startswith("#")
        found = text.find(("\n" + comment) if whole else comment, pos)
        if found < 0:
            return False
        pos = found + 1
    return True


def test_init_then_set_keeps_every_comment_and_changes_only_the_value_line() -> None:
    assert dsh("config", "init").returncode == 0
    path = config_file()
    assert path.read_text() == STARTER
    r = dsh("config", "set", "model", "openai:gpt-4o")
    assert r.returncode == 0, r.stderr
    assert "not kept" not in r.stderr
    before, after = STARTER.splitlines(), path.read_text().splitlines()
    assert len(after) == len(before)
    changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert changed == [(
        'model = "echo"          # an adapter id: echo, scripted:FILE, openai:MODEL, '
        'anthropic:MODEL',
        'model = "openai:gpt-4o"          # an adapter id: echo, scripted:FILE, openai:MODEL, '
        'anthropic:MODEL')]

    r = dsh("config", "set", "agents.coder.model", "openai:gpt-4o-mini")
    assert r.returncode == 0, r.stderr
    text = path.read_text()
    assert comments(text) == comments(STARTER)  # every comment line, in order
    assert kept_in_order(STARTER, text)
    assert "# [agents.coder]" in text  # the commented-out starter table stays a comment
    lines = text.splitlines()
    assert lines[:len(before)] == after  # what was there is untouched ...
    assert lines[len(before):] == ["", "[agents.coder]", 'model = "openai:gpt-4o-mini"']
    r = dsh("config", "set", "max_steps", "40")  # ... and a new top-level key goes after the
    assert r.returncode == 0, r.stderr           # last one, before the comments that follow
    lines = path.read_text().splitlines()
    assert lines[4:7] == ['agent = "default"', "max_steps = 40", ""]
    assert comments(path.read_text()) == comments(STARTER)
    cfg = load_config(path)
    assert (cfg.model, cfg.max_steps, cfg.agents["coder"].model) == (
        "openai:gpt-4o", 40, "openai:gpt-4o-mini")
    assert dsh("config", "validate").stdout == f"ok: {path}\n"


def test_unset_removes_the_key_and_the_table_it_empties_keeping_the_rest() -> None:
    assert dsh("config", "init").returncode == 0
    path = config_file()
    assert dsh("config", "set", "agents.coder.model", "openai:gpt-4o-mini").returncode == 0
    assert dsh("config", "set", "agents.coder.max_steps", "7").returncode == 0
    r = dsh("config", "unset", "agents.coder.max_steps")
    assert r.returncode == 0 and f"removed agents.coder.max_steps from {path}" in r.stderr
    assert load_config(path).agents["coder"].max_steps is None
    r = dsh("config", "unset", "agents.coder.model")
    assert r.returncode == 0, r.stderr
    assert path.read_text() == STARTER + "\n[agents.coder]\n"  # the emptied table stays
    assert "coder" in load_config(path).agents  # (alone, it still defines the agent)
    r = dsh("config", "unset", "agents.coder")
    assert r.returncode == 0, r.stderr
    assert path.read_text() == STARTER + "\n"
    r = dsh("config", "unset", "agents.coder.model")
    assert r.returncode == 2
    assert r.stderr == f"dsh: error: {path}: agents.coder.model is not set\n"
    r = dsh("config", "unset", "agent")
    assert r.returncode == 0 and 'agent = "default"' not in path.read_text()


def test_a_file_that_is_not_toml_is_refused_naming_the_line_and_left_as_it_was() -> None:
    path = config_file()
    path.parent.mkdir(parents=True)
    path.write_text('# mine\nmodel = "echo"\nagent = \n')
    for args in (("set", "model", "x"), ("unset", "model")):
        r = dsh("config", *args)
        assert r.returncode == 2
        assert r.stderr.startswith(f"dsh: error: {path}: invalid TOML: ")
        assert "line 3" in r.stderr
        assert path.read_text() == '# mine\nmodel = "echo"\nagent = \n'


def test_the_write_is_atomic_and_keeps_the_mode_and_the_layout_of_values(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    original = ('# top\nmodel = "echo"   # keep me\n\n[agents.coder]  # the coder\n'
                'options = { temperature = 0.2 }  # warm\n# tail\n')
    path.write_text(original)
    path.chmod(0o640)
    r = dsh("--config", str(path), "config", "set", "agents.coder.options.top_p", "0.9")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # no temporary file left
    assert path.read_text() == original.replace("temperature = 0.2 }", "temperature = 0.2, "
                                                                        "top_p = 0.9}")
    r = dsh("--config", str(path), "config", "set", "agents.coder.system", "'''two\nlines'''")
    assert r.returncode == 0, r.stderr
    assert path.read_text() == original.replace(
        "temperature = 0.2 }  # warm\n", "temperature = 0.2, top_p = 0.9}  # warm\n"
        "system = '''two\nlines'''\n")
    assert load_config(path).agents["coder"].system == "two\nlines"


# --------------------------------------------------------------------------------------------
# Property: setting any key of a commented file keeps every comment and reads back the value
# --------------------------------------------------------------------------------------------

COMMENTED = '''\
# A hand-written config: every comment here must survive `dsh config set`.
model = "echo"   # the default model

# agent = "coder"     (commented out: stays a comment)
max_steps = 20

[agents.coder]        # an agent
system = "Code."      # its system prompt
# tools = ["read_file"]
options = { temperature = 0.2 }   # sampling

# Plugins' settings.
[plugins.shell]
timeout = 30          # seconds

[plugins."my.review"]
# nothing set yet

# The end.
'''

#: The lines of keys COMMENTED sets with a comment of their own (which unset removes).
OWN_LINE = {("model",): 'model = "echo"   # the default model',
            ("agents", "coder", "system"): 'system = "Code."      # its system prompt',
            ("agents", "coder", "options"): "options = { temperature = 0.2 }   # sampling",
            ("plugins", "shell", "timeout"): "timeout = 30          # seconds"}

NAME = st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True) | st.sampled_from(
    ["coder", "shell", "my.review", "with space", "ünï"])
TEXT = st.text(max_size=20)
SCALAR = st.one_of(TEXT, st.integers(-10**6, 10**6), st.booleans(),
                   st.floats(allow_nan=False, allow_infinity=False, width=32))
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(NAME, inner, max_size=3), max_leaves=6)
KEYS = st.one_of(
    st.tuples(st.just("plugins"), NAME, NAME, VALUE),
    st.tuples(st.just("agents"), NAME, st.sampled_from(["system", "description"]), TEXT),
    st.tuples(st.just("agents"), NAME, st.just("max_steps"), st.integers(0, 1000)),
    st.tuples(st.sampled_from(["max_steps", "max_continuations"]), st.integers(0, 99)),
    st.tuples(st.just("sessions_dir"), TEXT),
    st.tuples(st.just("agents"), st.just("coder"), st.just("options"),
              st.sampled_from(["temperature", "seed", "my_field"]), SCALAR),
)


def toml_value(value: Any) -> str:
    """``value`` written as a TOML value, as a person would pass it to ``config set``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(c if c >= " " and c not in '"\\\x7f' else f"\\u{ord(c):04x}"
                             for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_key(part: str) -> str:
    return part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else toml_value(part)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=KEYS)
def test_set_keeps_every_comment_and_reads_back_the_value(case: tuple[Any, ...]) -> None:
    *parts, value = case
    key = ".".join(map(toml_key, parts))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_text(COMMENTED)
        try:
            dropped = set_value(path, key, toml_value(value))
        except DshError as exc:  # only a value the schema refuses (none generated here)
            raise AssertionError(f"{key} = {value!r}: {exc}") from None
        text = path.read_text()
        assert not dropped
        assert kept_in_order(COMMENTED, text), text
        data = tomllib.loads(text)
        expected = tomllib.loads(COMMENTED)
        table = expected
        for part in parts[:-1]:
            table = table.setdefault(part, {})
        table[parts[-1]] = value
        assert data == expected, text
        got: Any = data
        for part in parts:
            got = got[part]
        assert type(got) is type(value) and got == value
        unset_value(path, key)  # and removing it leaves every comment but the key's own
        own = OWN_LINE.get(tuple(parts))
        rest = COMMENTED.replace(own + "\n", "") if own else COMMENTED
        assert kept_in_order(rest, path.read_text())
