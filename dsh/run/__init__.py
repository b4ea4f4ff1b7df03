"""Running agents: the library API and everything one turn does.

``app`` (``App``: config, plugins, models, the store; the default model), ``agent``
(``Agent``: an assembled agent's scope, tools, prompt and options), ``session`` (``Session``:
an open session and one turn of it), ``subagent`` (the ``ask_CHILD`` tool), ``loop`` (the
built-in ``run_turn``), ``budget`` and ``recorder`` (layers of the chat and tool chains),
``compaction`` (keeping a long session inside its window) and ``prompt`` (the system prompt's
fragments).

May import: :mod:`dsh.core`, :mod:`dsh.host`, :mod:`dsh.ledger`, :mod:`dsh.config`,
:mod:`dsh.llm`, :mod:`dsh.tools`. Never the command line (:mod:`dsh.cli`) or the batch.
"""
