"""``[plugins.otel]``: the plugin's settings, checked (docs/otel.md, "Configuration")."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

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


def settings_from(table: Mapping[str, Any] | None,
                  where: str = "[plugins.otel]") -> Settings:
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
