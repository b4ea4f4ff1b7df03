"""dsh-otel: OpenTelemetry GenAI traces of dsh runs (issue 28, MISSION E8, docs/otel.md).

Installed, it is found through the ``dsh`` entry point ``otel``. It does nothing until
``[plugins.otel] enabled = true``: only then does its ``configure`` register an
``observe_event`` observer (:class:`dsh_otel.trace.Observer`) in the plugin manager, so an
installed but disabled plugin leaves every run unobserved (D7) and imports no OpenTelemetry.
``dsh otel export ID`` sends a finished session's trace, rebuilt from its ledger alone.

This module is imported on every dsh start-up: it imports neither opentelemetry nor click.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    import click
    import pluggy

__version__ = "0.1.0"
__all__ = ["NAME", "Settings", "__version__", "configure", "register_commands", "settings_from"]

#: The plugin's name: its entry point, the ``[plugins.otel]`` table, the agents' lists.
NAME = "otel"
#: The name the observer is registered under in a plugin manager.
OBSERVER = "otel.observer"
#: The OTLP/HTTP default when neither the config nor the environment names an endpoint.
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"


@attrs.frozen
class Settings:
    """``[plugins.otel]``, checked."""

    enabled: bool = False
    endpoint: str = ""
    headers: Mapping[str, str] = attrs.field(factory=dict)
    service_name: str = "dsh"
    resource: Mapping[str, str] = attrs.field(factory=dict)
    capture_content: bool = False
    timeout: float = 5.0
    max_queue: int = 2048

    def traces_endpoint(self) -> str:
        """The config's ``endpoint``, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
        ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else :data:`DEFAULT_ENDPOINT`."""
        if self.endpoint:
            return self.endpoint
        env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if env:
            return env
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        return base.rstrip("/") + "/v1/traces" if base else DEFAULT_ENDPOINT


_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "enabled": (bool, "true or false"),
    "endpoint": (str, "a URL such as http://127.0.0.1:4318/v1/traces"),
    "headers": (dict, "a table of strings"),
    "service_name": (str, "a string"),
    "resource": (dict, "a table of strings"),
    "capture_content": (bool, "true or false"),
    "timeout": ((int, float), "a number of seconds"),
    "max_queue": (int, "a whole number"),
}


def settings_from(table: Mapping[str, Any] | None, where: str = "[plugins.otel]") -> Settings:
    """:class:`Settings` from a ``[plugins.otel]`` table; a :class:`ConfigError` naming the
    key for an unknown key or a value of the wrong kind."""
    from dsh.core.errors import ConfigError

    table = dict(table or {})
    for key, value in table.items():
        if key not in _KINDS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(_KINDS)})")
        kind, expected = _KINDS[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(f"{where}: key {key!r}: expected {expected}, "
                              f"got {type(value).__name__}")
        if isinstance(value, dict) and not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in value.items()):
            raise ConfigError(f"{where}: key {key!r}: expected {expected}")
    endpoint = table.get("endpoint", "")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: key 'endpoint': expected an http:// or https:// URL, "
                          f"got {endpoint[:80]!r}")
    if "timeout" in table and not 0 < table["timeout"] <= 300:
        raise ConfigError(f"{where}: key 'timeout': expected seconds in (0, 300]")
    if "max_queue" in table and not 1 <= table["max_queue"] <= 1_000_000:
        raise ConfigError(f"{where}: key 'max_queue': expected 1 to 1000000")
    checked: dict[str, Any] = {k: (float(v) if k == "timeout" else v) for k, v in table.items()}
    return Settings(**checked)


_lock = threading.Lock()
_observer: Any = None


@hookimpl
def configure(app: Any, pm: pluggy.PluginManager) -> None:
    """Check ``[plugins.otel]``; when it is enabled, register the process's one observer in
    ``pm`` (once per manager). Disabled: nothing is built, nothing imported."""
    settings = settings_from(app.config.plugin_settings(NAME))
    if not settings.enabled or pm.get_plugin(OBSERVER) is not None:
        return
    global _observer
    with _lock:
        if _observer is None:
            from dsh_otel.trace import Observer

            _observer = Observer(settings, price=price_of(app))
    pm.register(_observer, name=OBSERVER)


def price_of(app: Any) -> Any:
    """``price(model_id)``: the model's price table from ``app``'s config, or None."""
    from dsh.run.budget import model_price

    models = app.config.models

    def price(model: str) -> tuple[float | None, ...] | None:
        return model_price(model, models.get(model))

    return price


@hookimpl
def register_commands(cli: click.Group) -> None:
    from dsh_otel.commands import otel

    cli.add_command(otel)
