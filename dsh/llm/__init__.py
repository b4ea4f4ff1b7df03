"""The llm subsystem: adapter interface, built-in adapters and the ``request`` chain.

May import: :mod:`dsh.config`, :mod:`dsh.ledger`, :mod:`dsh.host`, :mod:`dsh.core`,
:mod:`dsh.hookspecs`. Never the run (:mod:`dsh.run`), tools, the batch or a screen."""
