"""``[plugins.dsh-ray]``: read and checked without importing ray."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from dsh.core.errors import ConfigError

#: The values of ``ledgers``.
LEDGERS = ("shared", "ship")


@attrs.frozen
class Settings:
    """``[plugins.dsh-ray]``."""

    #: The cluster (``ray://…`` or ``HOST:PORT``); default ``RAY_ADDRESS``; neither: a local
    #: Ray started for the batch (and stopped after it).
    address: str | None = None
    #: CPUs of the local Ray started when no address is given (default: Ray's, all of them).
    num_cpus: float | None = None
    #: CPUs each task reserves on the cluster (Ray's scheduling unit; 0.25: four I/O-bound
    #: agent runs per CPU).
    task_cpus: float = 1.0
    #: Ray's ``runtime_env`` for the batch's job (``pip``, ``py_modules``, ``env_vars``…).
    runtime_env: dict[str, Any] | None = None
    #: Ray namespace of the job.
    namespace: str | None = None
    #: How ledgers reach the driver's store: ``shared`` (workers write into its directory:
    #: a shared filesystem) or ``ship`` (workers write a local copy and stream it back).
    ledgers: str = "shared"


def settings_from(raw: Mapping[str, Any]) -> Settings:
    """:class:`Settings` from the config table; a bad key or value is a :class:`ConfigError`
    naming it."""
    where = "[plugins.dsh-ray]"
    known = {f.name for f in attrs.fields(Settings)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
    if raw.get("ledgers") is not None and raw["ledgers"] not in LEDGERS:
        raise ConfigError(f"{where} ledgers: must be one of {', '.join(LEDGERS)}")
    for key in ("address", "namespace"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"{where} {key}: must be a string")
    for key in ("num_cpus", "task_cpus"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0
                                  or (key == "num_cpus" and value == 0)):
            raise ConfigError(f"{where} {key}: must be a positive number")
    env = raw.get("runtime_env")
    if env is not None and not isinstance(env, Mapping):
        raise ConfigError(f"{where} runtime_env: must be a table")
    return Settings(address=raw.get("address") or None, num_cpus=raw.get("num_cpus"),
                    task_cpus=float(raw["task_cpus"]) if raw.get("task_cpus") is not None
                    else 1.0,
                    runtime_env=dict(env) if env else None, namespace=raw.get("namespace"),
                    ledgers=raw.get("ledgers") or "shared")
