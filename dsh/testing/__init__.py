"""pytest fixtures for testing dsh plugins (docs/testing-plugins.md).

Installed with dsh as the pytest plugin ``dsh`` (entry point group ``pytest11``), so a plugin's
test suite only asks for the fixtures::

    def test_greets(dsh_script, dsh_run):
        dsh_script.text("Hello!")
        result = dsh_run("Say hello")
        assert result.output == "Hello!"
        assert result.requests[0].messages[-1].content == "Say hello"

Every app the fixtures build answers with a **scripted model** (:class:`Script`: replies you
give in order; every request it received), keeps its sessions under ``tmp_path``, and runs in
an environment without API keys or the developer's config (:func:`dsh_env`). Results
(:class:`PromptResult`, :class:`CliResult`) carry the session's ledger events, typed and as
the ledger's JSON objects, and the exact requests the model received.

The fixtures and :class:`IsolatedEnv` live here, where pytest finds them; the scripted model
(:class:`Script`, the adapter, the ``register_models`` hook this module re-exports) is
:mod:`dsh.testing.script`, and the app under test with its results (:class:`ScriptedApp`,
:class:`PromptResult`, :class:`CliResult`, :func:`request_to_dict`) is :mod:`dsh.testing.app`.
Every name stays importable from ``dsh.testing``.

Importing this module is cheap: pytest loads it in every test run of an environment where dsh
is installed, so it and its two modules import only pytest and pluggy (already loaded) at
module level; dsh's app, providers, httpx and cattrs are imported by the fixtures that need
them. Disable it with ``pytest -p no:dsh``.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import sys
import types
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.testing.app import CliResult as CliResult  # re-exported
from dsh.testing.app import PromptResult as PromptResult  # re-exported
from dsh.testing.app import Result as Result  # re-exported
from dsh.testing.app import ScriptedApp as ScriptedApp  # re-exported
from dsh.testing.app import request_to_dict as request_to_dict  # re-exported
from dsh.testing.script import _SCRIPT_IDS
from dsh.testing.script import _SCRIPTS
from dsh.testing.script import MODEL as MODEL  # re-exported
from dsh.testing.script import Script as Script  # re-exported
from dsh.testing.script import register_models as register_models  # re-exported: a dsh hook

__all__ = [
    "MODEL",
    "CliResult",
    "IsolatedEnv",
    "PromptResult",
    "Result",
    "Script",
    "ScriptedApp",
    "request_to_dict",
]


def __getattr__(name: str) -> Any:
    """``dsh.testing.replay`` (:func:`dsh.testing._replay.replay`), imported when first asked
    for: loading the pytest plugin does not pay for it."""
    if name == "replay":
        from dsh.testing._replay import replay

        globals()["replay"] = replay
        return replay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Environment variables :func:`dsh_env` removes, besides every ``DSH_*`` variable.
SECRET_VARIABLE = re.compile(r"(API_KEY|API_TOKEN|_TOKEN|_SECRET|SECRET_KEY|ACCESS_KEY|"
                             r"_PASSWORD|_BASE_URL|^RAY_ADDRESS)$")


class IsolatedEnv:
    """Where :func:`dsh_env` put dsh's state for this test (every path under ``tmp_path``)."""

    def __init__(self, root: Path) -> None:
        #: The directory of everything below.
        self.root = root
        #: ``$DSH_HOME``: dsh's data directory (the default sessions directory is in it).
        self.home = root / "home"
        #: ``$XDG_CONFIG_HOME``: dsh looks for ``dsh/config.toml`` here (there is none).
        self.config_home = root / "config"
        #: ``$XDG_DATA_HOME``, ``$XDG_CACHE_HOME``, ``$XDG_STATE_HOME``.
        self.data_home = root / "data"
        self.cache_home = root / "cache"
        self.state_home = root / "state"
        #: The names of the variables removed from the environment (their values are not
        #: kept anywhere).
        self.removed: list[str] = []
        self._apps = itertools.count(1)

    def sessions_dir(self) -> Path:
        """A new sessions directory for the next app (``sessions``, ``sessions-2``, …)."""
        n = next(self._apps)
        return self.root / ("sessions" if n == 1 else f"sessions-{n}")


@pytest.fixture
def dsh_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> IsolatedEnv:
    """Isolate dsh from the machine for one test, and say where its state goes.

    Sets ``DSH_HOME`` and ``XDG_CONFIG_HOME`` / ``XDG_DATA_HOME`` / ``XDG_CACHE_HOME`` /
    ``XDG_STATE_HOME`` to directories under ``tmp_path/dsh``; removes every other ``DSH_*``
    variable (``DSH_CONFIG``, ``DSH_LOAD_PLUGINS``…) and every variable that looks like a
    credential or an endpoint (names ending in ``API_KEY``, ``_TOKEN``, ``_SECRET``,
    ``_PASSWORD``, ``_BASE_URL``…) or a cluster (``RAY_ADDRESS``), so no test reads the
    developer's config or reaches a real provider or cluster; sets
    ``DSH_KEYS_BACKEND=file``, so keys stored with ``dsh keys`` are read from the empty config
    directory, never from the OS keyring. Everything is restored after the test.
    """
    env = IsolatedEnv(tmp_path / "dsh")
    for name in list(os.environ):
        if name.startswith("DSH_") or SECRET_VARIABLE.search(name):
            env.removed.append(name)
            monkeypatch.delenv(name)
    for name, path in (("DSH_HOME", env.home), ("XDG_CONFIG_HOME", env.config_home),
                       ("XDG_DATA_HOME", env.data_home), ("XDG_CACHE_HOME", env.cache_home),
                       ("XDG_STATE_HOME", env.state_home)):
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(path))
    monkeypatch.setenv("DSH_KEYS_BACKEND", "file")
    return env


@pytest.fixture
def dsh_config() -> dict[str, Any]:
    """The config of ``dsh_app``, as the dict a ``dsh.toml`` would load as: empty here.
    Override it in your ``conftest.py`` (or a test module) to test your plugin's setup::

        @pytest.fixture
        def dsh_config():
            return {"agents": {"writer": {"plugins": ["example"]}},
                    "plugins": {"example": {"max_words": 100}}}
    """
    return {}


@pytest.fixture
def dsh_plugins() -> list[Any]:
    """Plugins ``dsh_app`` registers in-process besides the installed ones: empty here.
    Override it to test hooks that are not installed (see ``dsh_make_app``'s ``plugins``)."""
    return []


@pytest.fixture
def dsh_make_app(dsh_env: IsolatedEnv,
                 monkeypatch: pytest.MonkeyPatch) -> Callable[..., ScriptedApp]:
    """A factory of apps under test: ``dsh_make_app(config=None, *, plugins=(),
    script=None) -> ScriptedApp``. Use it for several apps in one test, or one config per
    test; ``dsh_app`` is ``dsh_make_app(dsh_config, plugins=dsh_plugins)``.

    The app is ``App.from_config(config)`` plus:

    - ``sessions_dir``: a new directory under ``tmp_path`` (unless the config sets one);
    - ``model = "dsh-testing"``, the scripted model (unless the config sets one; an agent
      that names its own model keeps it - pass ``model=dsh.testing.MODEL`` to the run);
    - ``load``: this module (it provides the model) and the ``plugins`` given.

    Installed plugins are found through their entry points as usual (the config's
    ``autoload = false`` turns that off). ``plugins`` registers others in-process: a
    ``{"name": object}`` mapping (a module, a class instance… registered under ``name``), or
    a list of modules (registered under their ``__name__``) and importable module names.
    ``script`` is the :class:`Script` (or a list of reply dicts) to start from.
    """

    def make(config: Mapping[str, Any] | str | os.PathLike[str] | None = None, *,
             plugins: Mapping[str, Any] | Iterable[Any] = (),
             script: Script | Iterable[Mapping[str, Any]] | None = None) -> ScriptedApp:
        cfg = copy.deepcopy(dict(_config_mapping(config)))
        if not isinstance(script, Script):
            script = Script(script or ())
        key = f"script-{next(_SCRIPT_IDS)}"
        _SCRIPTS[key] = script
        if "sessions_dir" not in cfg:
            cfg["sessions_dir"] = str(dsh_env.sessions_dir())
        sessions = Path(cfg["sessions_dir"])
        cfg.setdefault("model", MODEL)
        cfg["models"] = {**cfg.get("models", {}), MODEL: {"adapter": MODEL, "script": key}}
        load = [str(x) for x in cfg.get("load", [])]
        if __name__ not in load:
            load.append(__name__)
        for name in _plugin_names(plugins, monkeypatch):
            if name not in load:
                load.append(name)
        cfg["load"] = load
        return ScriptedApp(cfg, script, sessions)

    return make


def _config_mapping(config: Mapping[str, Any] | str | os.PathLike[str] | None
                    ) -> Mapping[str, Any]:
    """``dsh_make_app``'s config as a mapping: a mapping, TOML text, or a TOML file's path
    (errors name the file and line, as ``dsh --config`` does)."""
    if config is None or isinstance(config, Mapping):
        return config or {}
    import tomllib

    from dsh.config.loader import read_config_text
    from dsh.core.errors import ConfigError
    from dsh.run.app import is_toml_text

    where = "<config text>"
    if isinstance(config, str) and is_toml_text(config):
        text = config
    else:
        where = os.fspath(config)
        try:
            text = read_config_text(Path(where))
        except FileNotFoundError:
            raise ConfigError(f"{where}: config file not found") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None


def _plugin_names(plugins: Mapping[str, Any] | Iterable[Any],
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The ``load`` names of ``plugins``, registering objects in ``sys.modules`` (undone
    after the test), where dsh's ``load`` finds them."""
    items: Iterable[tuple[str | None, Any]] = (
        plugins.items() if isinstance(plugins, Mapping) else ((None, p) for p in plugins))
    for name, obj in items:
        if name is None:
            if isinstance(obj, str):
                yield obj
                continue
            if not isinstance(obj, types.ModuleType):
                raise TypeError(f"dsh_make_app(plugins=...): {obj!r} is not a module: pass "
                                "{'NAME': plugin} to name it")
            name = obj.__name__
        if sys.modules.get(name) is not obj:
            monkeypatch.setitem(sys.modules, name, obj)
        yield name


@pytest.fixture
def dsh_app(dsh_make_app: Callable[..., ScriptedApp], dsh_config: dict[str, Any],
            dsh_plugins: list[Any]) -> ScriptedApp:
    """The app under test: :class:`ScriptedApp` built from ``dsh_config`` and
    ``dsh_plugins`` (``dsh_make_app`` says what it adds)."""
    return dsh_make_app(dsh_config, plugins=dsh_plugins)


@pytest.fixture
def dsh_script(dsh_app: ScriptedApp) -> Script:
    """The scripted model of ``dsh_app``: add the replies a test needs, read the requests it
    received."""
    return dsh_app.script


@pytest.fixture
def dsh_run(dsh_app: ScriptedApp) -> Callable[..., PromptResult]:
    """Run a prompt in ``dsh_app``: ``dsh_run(prompt, *, agent=None, session=None, **kw)
    -> PromptResult`` (:meth:`ScriptedApp.run`)."""
    return dsh_app.run


@pytest.fixture
def dsh_cli(dsh_app: ScriptedApp) -> Callable[..., CliResult]:
    """Run ``dsh ARGS...`` in-process against ``dsh_app``: ``dsh_cli("run", "-a", "writer",
    "hello", input=None, env=None) -> CliResult`` (:meth:`ScriptedApp.cli`)."""
    return dsh_app.cli
