"""The vocabulary every other package speaks: value objects, errors, and the small edges.

``messages`` (provider-neutral messages, tool calls, requests and responses), ``errors`` (every
error dsh raises on purpose, with its exit code), ``sanitize`` (text made writable as UTF-8,
strict JSON), ``redact`` (dsh's secrets kept out of what it shows or records), ``files`` (the
one bounded reader of regular files) and ``modeldata`` (context windows and prices).

May import: the standard library and attrs only; nothing else of dsh.
"""
