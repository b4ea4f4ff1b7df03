"""The library API: assemble from TOML or a dict (no I/O beyond reading it), run, resume."""

from __future__ import annotations

from pathlib import Path

import dsh


def test_assembly_reads_the_config_and_writes_nothing(tmp_path: Path):
    config = tmp_path / "dsh.toml"
    config.write_text('model = "echo"\n[agents.default]\nsystem = "Be brief."\n')
    before = sorted(p for p in tmp_path.rglob("*"))
    app = dsh.App.from_config(config)
    agent = app.agent()
    assert (agent.model_id, agent.system) == ("echo", "Be brief.")
    assert sorted(p for p in tmp_path.rglob("*")) == before  # no session dir, no files


def test_run_output_session_outcome_and_resume_by_id(tmp_path: Path):
    app = dsh.App.from_config({"model": "echo", "autoload": False,
                               "sessions_dir": str(tmp_path / "s")})
    first = app.run("hello")
    assert (first.output, first.outcome, first.steps) == ("hello", "completed", 1)
    assert first.path == tmp_path / "s" / f"{first.session_id}.jsonl"
    again = dsh.App.from_config({"model": "echo", "autoload": False,
                                 "sessions_dir": str(tmp_path / "s")}).run(
        "again", session=first.session_id)
    assert again.session_id == first.session_id
    with app.store.open(first.session_id) as ledger:
        assert [m.content for m in ledger.projection.view()] == ["hello", "hello", "again",
                                                                 "again"]
    assert again.check() is again


def test_public_api_is_small_and_lazy():
    import subprocess
    import sys

    code = ("import sys, dsh; print(sorted(m for m in ('dsh.app', 'pluggy', 'httpx', 'cattrs')"
            " if m in sys.modules)); print(dsh.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "[]"  # `import dsh` imports none of them
    assert out[1] == dsh.__version__
    assert callable(dsh.hookimpl) and callable(dsh.tool) and callable(dsh.context)


def test_one_turn_at_a_time_per_session(tmp_path: Path):
    import threading

    from dsh.core.errors import SessionInUse

    app = dsh.App.from_config({"autoload": False, "sessions_dir": str(tmp_path / "s")})
    script = tmp_path / "slow.json"
    script.write_text('{"responses": [{"text": "slow", "delay": 0.5}, {"text": "second"}]}')
    with app.session(model=f"scripted:{script}") as session:
        first = threading.Thread(target=session.send, args=("one",))
        first.start()
        import time

        time.sleep(0.1)
        try:
            session.send("two")
        except SessionInUse as exc:
            assert "running a turn in another thread" in str(exc)
        else:
            raise AssertionError("a second concurrent send must be refused")
        first.join()
        assert session.send("three").output == "second"  # free again afterwards
