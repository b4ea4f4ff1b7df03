"""The llm subsystem: adapter interface, built-in adapters and the ``request`` chain.

Modules: ``base`` (the ``Model`` interface), ``builtin`` (the ``request`` chain), the adapters
``openai``, ``anthropic``, ``responses``, the ``http`` package (their HTTP plumbing), ``transport``
(the one exit for bytes, C3), ``rescue``, ``sse``, ``schema``, ``attachments``.

May import: :mod:`dsh.config`, :mod:`dsh.ledger`, :mod:`dsh.host`, :mod:`dsh.core`,
:mod:`dsh.hookspecs`. Never the run (:mod:`dsh.run`), tools, the batch or a screen."""
