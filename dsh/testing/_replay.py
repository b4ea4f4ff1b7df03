"""``dsh.testing.replay``: replay a recorded session in a test, with no model (issue 37;
docs/testing-plugins.md).

Record a session once — with a real model, or any model — keep its ledger (and the store's
``attachments/`` folder, if it has any) in your test data, and replay it in CI::

    from dsh.testing import replay

    def test_my_plugin_still_builds_the_same_requests(dsh_make_app):
        app = dsh_make_app({"sessions_dir": "tests/data/sessions", "load": ["my_plugin"]})
        report = replay(app, "20261202-060357.140-1a0a61")
        assert report.ok, report.summary() + "\\n" + report.divergence.diff

``report.requests`` are the requests compared (each with ``index``, ``turn``, ``step``,
``seq`` and the recorded ``request``), ``report.divergence`` the first difference
(``request``, ``turn``, ``step``, ``field``, ``diff``, ``message``). It is what ``dsh replay``
prints: :mod:`dsh.run.replay`.
"""

from __future__ import annotations

from typing import Any


def replay(app: Any, session: str = "latest", *, children: bool = True) -> Any:
    """Replay stored session ``session`` (an id, a unique prefix, ``latest``, or a run's
    result) of ``app`` — a :class:`dsh.testing.ScriptedApp`, a :class:`dsh.App`, a config
    mapping, TOML text or a config file's path — under that app's config and plugins.
    Returns a :class:`dsh.run.replay.ReplayReport` (``ok``, ``requests``, ``divergence``,
    ``notes``, ``children``, ``summary()``). No model is called and no tool runs."""
    from dsh.run.app import App
    from dsh.run.replay import replay as _replay

    target = getattr(app, "app", app)  # a ScriptedApp holds its App
    if not isinstance(target, App):
        target = App.from_config(target)
    sid = getattr(session, "session_id", None) or session
    return _replay(target, str(sid), children=children)
