"""The plugin host: what every plugin is handed, below the subsystems that use it.

``manager`` (plugin managers: built-ins, entry-point discovery, blocking), ``runcontext``
(``RunContext``, the unit of isolation of one run, and ``Limits``), ``scope`` (per-agent scope
and the ``AgentHandle``) and ``stash`` (typed per-plugin storage).

May import: :mod:`dsh.core`, :mod:`dsh.hookspecs` (the markers), pluggy. Never the ledger,
the config, a provider, the loop or the screen (``scope.record_event`` reaches
:mod:`dsh.ledger.plugin_events` lazily: the one listed exception in ``.importlinter``).
"""
