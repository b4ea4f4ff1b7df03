"""``dsh otel export ID``: send a finished session's trace, rebuilt from its ledger alone."""

from __future__ import annotations

import click


@click.group()
def otel() -> None:
    """OpenTelemetry traces of sessions (dsh-otel)."""


@otel.command("export")
@click.argument("session_id", metavar="ID")
@click.option("--endpoint", help="The OTLP/HTTP traces URL (default: [plugins.otel] endpoint, "
                                 "else OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT).")
@click.option("--content/--no-content", default=None,
              help="Record prompts, answers and tool data (default: [plugins.otel] "
                   "capture_content).")
@click.pass_obj
def otel_export(state: object, session_id: str, endpoint: str | None,
                content: bool | None) -> None:
    """Send session ID's trace (its sub-agent sessions nested) to an OTLP collector.

    Exit 1 with `dsh: error:` when the collector did not take every span."""
    import attrs

    from dsh.cli.root import resolve_session
    from dsh.cli.root import warn
    from dsh.core.errors import DshError
    from dsh_otel import NAME
    from dsh_otel import price_of
    from dsh_otel.settings import settings_from

    app = state.app  # type: ignore[attr-defined]
    settings = settings_from(app.config.plugin_settings(NAME))
    if endpoint is not None:
        settings = settings_from({**attrs.asdict(settings), "endpoint": endpoint},
                                 where="--endpoint")
    if content is not None:
        settings = attrs.evolve(settings, capture_content=content)
    sid = resolve_session(app, session_id)
    from dsh_otel.trace import Spans
    from dsh_otel.trace import feed_session
    from dsh_otel.trace import provider_for

    provider, exporter = provider_for(settings)
    spans = Spans(provider.get_tracer("dsh"), price=price_of(app),
                  capture_content=settings.capture_content)
    events = feed_session(spans, app.store.read, sid)
    spans.close()
    provider.shutdown()
    if exporter.failed or not exporter.exported:
        raise DshError(f"otel: {exporter.failed} of {exporter.failed + exporter.exported} "
                       f"spans not accepted by {exporter.endpoint}")
    warn(f"otel: sent {exporter.exported} spans of {events} events to {exporter.endpoint}")
