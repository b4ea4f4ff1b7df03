"""The llm subsystem: adapter interface, built-in adapters and the ``request`` chain.

Modules: ``base`` (the ``Model`` interface), ``builtin`` (the ``request`` chain), the adapters
``openai``, ``anthropic``, ``responses`` and ``http/`` (their HTTP plumbing: ``client``,
``settings``, ``errors``, ``model``), ``transport`` (the one exit for bytes, C3) with ``record``
(what the app records for it) and ``invariant`` (the C3 comparison), ``rescue`` (text tool
calls), ``sse``, ``schema`` (structured output), ``attachments``.

May import: :mod:`dsh.config`, :mod:`dsh.ledger`, :mod:`dsh.host`, :mod:`dsh.core`,
:mod:`dsh.hookspecs`. Never the run (:mod:`dsh.run`), tools, the batch or a screen."""
