"""``dsh config validate`` catches what ``dsh run`` would refuse, with the same message and
exit code 2: the default agent (``agent = …``) must exist (a typo no longer runs a fresh
agent with every plugin), a ``base_url`` needs its scheme, a built-in adapter's table holds
only the keys it reads and no misspelt option; every built-in model is built from its
settings. Every config in docs/ and examples/ still reads.

Real ``dsh`` processes with an isolated config dir (conftest.py); no network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dsh.config import modelcheck
from dsh.config.loader import config_from_dict

DSH = [sys.executable, "-m", "dsh"]
ROOT = Path(__file__).resolve().parent.parent


def dsh(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, "--config", str(path), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DSH_LOAD_PLUGINS": ""})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_an_unknown_default_agent_is_refused_by_validate_and_run_alike(tmp_path: Path) -> None:
    path = write(tmp_path, '# mine\nmodel = "echo"\nagent = "codr"\n\n[agents.coder]\n'
                           'system = "Code."\n')
    expected = (f"dsh: error: {path}:3: key 'agent': unknown agent 'codr'; did you mean "
                "'coder'?\n")
    for args in (("config", "validate"), ("run", "hi")):
        r = dsh(path, *args)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", expected), args
    assert not (Path(os.environ["DSH_HOME"]) / "sessions").exists() or not any(
        (Path(os.environ["DSH_HOME"]) / "sessions").rglob("*.jsonl"))  # nothing ran
    r = dsh(path, "run", "-a", "coder", "hi")  # the agent that exists still runs
    assert (r.returncode, r.stdout) == (0, "hi\n"), r.stderr


def test_run_dash_a_with_an_unknown_agent_says_the_nearest_one(tmp_path: Path) -> None:
    path = write(tmp_path, 'model = "echo"\nagent = "coder"\n[agents.coder]\n[agents.chat]\n')
    r = dsh(path, "run", "-a", "codr", "hi")
    assert (r.returncode, r.stderr) == (2, "dsh: error: unknown agent 'codr'; did you mean "
                                           "'coder'?\n")
    r = dsh(path, "run", "-a", "zzz", "hi")
    assert (r.returncode, r.stderr) == (2, "dsh: error: unknown agent 'zzz' (configured: "
                                           "coder, chat)\n")
    assert dsh(path, "config", "validate").returncode == 0


def test_an_agent_without_a_table_or_a_near_name_says_how_to_fix_it(tmp_path: Path) -> None:
    path = write(tmp_path, 'agent = "reviewer"\n')
    r = dsh(path, "config", "validate")
    assert r.returncode == 2
    assert r.stderr == (f"dsh: error: {path}:1: key 'agent': unknown agent 'reviewer' "
                        "(configured: none); add an [agents.reviewer] table, or leave agent "
                        "out to use 'default'\n")
    path.write_text('agent = "defualt"\n')
    assert "did you mean 'default'?" in dsh(path, "config", "validate").stderr
    path.write_text('agent = "default"\n')  # `default` needs no table
    assert dsh(path, "config", "validate").returncode == 0


def test_a_base_url_without_a_scheme_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, 'model = "openai:gpt-4o"\n\n[models."openai:gpt-4o"]\n'
                           'base_url = "127.0.0.1:8765/v1"\n')
    expected = (f"dsh: error: {path}:4: key 'models.\"openai:gpt-4o\".base_url': expected an "
                "http(s) URL, got '127.0.0.1:8765/v1' (no scheme); did you mean "
                "'http://127.0.0.1:8765/v1'?\n")
    for args in (("config", "validate"), ("run", "hi")):
        r = dsh(path, *args)
        assert (r.returncode, r.stderr) == (2, expected), args
    before = path.read_text()  # config set refuses it too, leaving the file
    r = dsh(path, "config", "set", 'models."openai:gpt-4o".base_url', "localhost:8000/v1")
    assert r.returncode == 2 and "did you mean 'http://localhost:8000/v1'?" in r.stderr
    assert path.read_text() == before


@pytest.mark.parametrize(("table", "message"), [
    ("temprature = 0.2",
     "4: unknown key 'models.\"openai:gpt-4o\".temprature'; did you mean "
     "'options.temperature'? (request options go in the model's options table: "
     "models.\"openai:gpt-4o\".options)"),
    ("api_key_evn = \"K\"", "4: unknown key 'models.\"openai:gpt-4o\".api_key_evn'; did you "
                            "mean 'api_key_env'?"),
    ("options = { temprature = 0.2 }",
     "4: unknown option 'models.\"openai:gpt-4o\".options.temprature'; did you mean "
     "'temperature'?"),
])
def test_unknown_settings_and_misspelt_options_of_a_builtin_adapter(tmp_path: Path, table: str,
                                                                    message: str) -> None:
    path = write(tmp_path, f'model = "openai:gpt-4o"\n\n[models."openai:gpt-4o"]\n{table}\n')
    for args in (("config", "validate"), ("run", "hi")):
        r = dsh(path, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith(f"dsh: error: {path}:{message}"), r.stderr


def test_agent_options_are_checked_against_their_models_adapter(tmp_path: Path) -> None:
    path = write(tmp_path, 'model = "anthropic:claude-x"\n[agents.a]\n'
                           'options = { max_token = 5 }\n')
    r = dsh(path, "config", "validate")
    assert r.returncode == 2
    assert r.stderr == (f"dsh: error: {path}:3: unknown option 'agents.a.options.max_token'; "
                        "did you mean 'max_tokens'? (a key the API does not know is sent as it "
                        "is and ignored or refused by the server)\n")
    path.write_text('model = "echo"\n[agents.a]\noptions = { max_token = 5 }\n')
    assert dsh(path, "config", "validate").returncode == 0  # echo takes any option


def test_servers_own_options_and_other_adapters_tables_stay_valid(tmp_path: Path) -> None:
    path = write(tmp_path, '''model = "openai:local"
[models."openai:local"]
base_url = "http://127.0.0.1:8080/v1"
reasoning_replay = "all"
options = { top_k = 40, min_p = 0.05, mirostat = 2, my_server_field = 1, temperature = 0.1 }
[models.other]
adapter = "llm"
anything = "goes"
[models."anthropic:claude-x"]
cache = "off"
''')
    r = dsh(path, "config", "validate")
    assert (r.returncode, r.stdout) == (0, f"ok: {path}\n"), r.stderr


def test_validate_builds_the_builtin_models_as_run_would(tmp_path: Path) -> None:
    """Before, validate said ok and only `dsh run` refused these (the adapter's checks)."""
    path = write(tmp_path, 'model = "echo"\n[models.fast]\nadapter = "openai"\nretries = -1\n')
    r = dsh(path, "config", "validate")
    assert r.returncode == 2
    assert r.stderr == f"dsh: error: {path}: openai:fast: `retries` must be an integer >= 0, " \
                       "got -1\n"
    r = dsh(path, "run", "-m", "fast", "hi")
    assert r.returncode == 2 and "`retries` must be an integer >= 0, got -1" in r.stderr


def test_the_key_lists_cover_every_setting_the_builtin_adapters_read() -> None:
    """modelcheck cannot import dsh.llm (a layer above): its lists are checked here."""
    read: set[str] = set()
    for f in [*(ROOT / "dsh/llm").glob("*.py"), *(ROOT / "dsh/llm/http").glob("*.py")]:
        if f.name == "builtin.py":  # echo and scripted: not checked
            continue
        src = f.read_text()
        read |= set(re.findall(r'settings\.get\("([a-z_]+)"', src))
        read |= set(re.findall(r'settings\["([a-z_]+)"\]', src))
        read |= set(re.findall(r'"([a-z_]+)" in (?:self\.)?settings', src))
        for group in re.findall(r'for key in \(([^)]*)\):\n\s+if key in settings', src):
            read |= set(re.findall(r'"([a-z_]+)"', group))
    assert {"base_url", "timeout", "cache", "schema_dialect"} <= read  # the scan works
    known = {*modelcheck.DSH_KEYS, *modelcheck.HTTP_KEYS,
             *(k for keys in modelcheck.ADAPTER_KEYS.values() for k in keys)}
    assert read - known == set()


def doc_configs() -> list[tuple[str, str]]:
    """Every dsh config in the docs (```toml blocks that are not pyproject files) and the
    example config files."""
    found = []
    for f in sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md",
                     *ROOT.glob("plugins/*/README.md")]):
        text = f.read_text()
        for m in re.finditer(r"```toml\n(.*?)```", text, re.S):
            # Another program's file (Codex's config.toml) says so on its first line.
            if re.match(r"# .*\(.*not dsh's\)", m.group(1)):
                continue
            if not re.search(r"^\[(project|build-system|tool)", m.group(1), re.M):
                found.append((f"{f.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 2}",
                              m.group(1)))
    for f in sorted([*ROOT.glob("docs/examples/*/dsh.toml"), *ROOT.glob("examples/*/dsh.toml")]):
        found.append((str(f.relative_to(ROOT)), f.read_text()))
    return found


def test_every_config_in_the_docs_and_examples_still_reads() -> None:
    configs = doc_configs()
    assert len(configs) >= 20
    for where, text in configs:
        config_from_dict(tomllib.loads(text), source=where, text=text)
