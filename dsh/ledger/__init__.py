"""The session ledger (MISSION A5, C1–C3): what was recorded, and the only memory a model has.

``events`` (the persistent event classes), ``serialize`` (the one place events become JSON and
back), ``store`` (the JSON Lines session store: files, lock, repair, listing), ``writer``
(``Ledger``, an open session being appended to), ``scan`` (reading and checking ledger lines),
``blobs`` (attachment bytes by hash, in files or memory), ``history`` (the projection of the
ledger into model messages) and ``plugin_events`` (``x/PLUGIN/NAME`` lines).

May import: :mod:`dsh.core`, :mod:`dsh.host`, :mod:`dsh.hookspecs`. Never a provider
(:mod:`dsh.llm`), the run (:mod:`dsh.run`) or a screen (:mod:`dsh.cli`).

``dsh.ledger`` was one module before 0.3: its names (``JsonlStore``, ``Ledger``…) still resolve
here, from :mod:`dsh.ledger.store`, deprecated (CHANGELOG.md's deprecation policy).
"""

from dsh._compat import package_getattr

__getattr__ = package_getattr(
    __name__, "dsh.ledger.store",
    frozenset({"events", "serialize", "store", "history", "plugin_events", "blobs", "scan",
               "writer"}))
