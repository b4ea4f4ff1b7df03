"""dsh-otel: OpenTelemetry GenAI traces of dsh runs (issue 28, MISSION E8, docs/otel.md).

Installed, it is found through the ``dsh`` entry point ``otel``. It does nothing until
``[plugins.otel] enabled = true``: only then does its ``configure`` register an
``observe_event`` observer (:class:`dsh_otel.trace.Observer`) in the plugin manager, so an
installed but disabled plugin leaves every run unobserved (D7) and imports no OpenTelemetry.
``dsh otel export ID`` sends a finished session's trace, rebuilt from its ledger alone.

This module is imported on every dsh start-up: it imports neither opentelemetry nor click.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING
from typing import Any

from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    import click
    import pluggy

__version__ = "0.1.0"
__all__ = ["NAME", "__version__", "configure", "price_of", "register_commands"]

#: The plugin's name: its entry point, the ``[plugins.otel]`` table, the agents' lists.
NAME = "otel"
#: The name the observer is registered under in a plugin manager.
OBSERVER = "otel.observer"


_lock = threading.Lock()
_observer: Any = None


@hookimpl
def configure(app: Any, pm: pluggy.PluginManager) -> None:
    """Check ``[plugins.otel]``; when it is enabled, register the process's one observer in
    ``pm`` (once per manager). Without the table nothing is even imported; disabled, nothing
    is built."""
    table = app.config.plugin_settings(NAME)
    if not table:
        return
    from dsh_otel.settings import settings_from

    settings = settings_from(table)
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
