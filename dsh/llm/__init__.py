"""The llm subsystem: adapter interface, built-in adapters and the ``request`` chain."""
