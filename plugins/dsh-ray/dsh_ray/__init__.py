"""dsh-ray: run ``dsh batch`` on a Ray cluster (``dsh batch --executor ray``).

Installed, it is found through the ``dsh`` entry point ``ray`` and answers the
``batch_executor`` hook for the name ``ray``: each task runs as a Ray task on the cluster
named by ``[plugins.dsh-ray] address`` or ``RAY_ADDRESS`` (a local Ray started for the batch
when neither is set), the batch's budget is one Ray actor every run reserves against, and
every ledger is written into the driver's session store (docs/ray.md).

This module is imported on every dsh start-up, so it stays tiny: ``ray`` and
:mod:`dsh_ray.executor` are imported only when ``--executor ray`` is asked for.
"""

from __future__ import annotations

from typing import Any

from dsh.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["NAME", "__version__", "batch_executor"]

#: The executor's name (``--executor ray``) and the config table (``[plugins.dsh-ray]``).
NAME = "ray"
SETTINGS = "dsh-ray"


@hookimpl
def batch_executor(name: str, app: Any) -> Any:
    """The Ray executor for ``--executor ray`` (None for any other name)."""
    if name != NAME:
        return None
    from dsh_ray.settings import settings_from

    settings = settings_from(app.config.plugin_settings(SETTINGS))  # bad ones: before ray
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        from dsh.core.errors import ConfigError

        raise ConfigError("--executor ray: the ray package is not installed in dsh's "
                          "environment (pip install 'ray>=2.40,<3')")
    from dsh_ray.executor import RayExecutor

    return RayExecutor(settings)
