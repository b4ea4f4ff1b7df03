"""Generate docs/hooks.md from dsh/hookspecs.py (the docstrings are the contract).

    python docs/gen_hooks.py > docs/hooks.md

tests/test_docs.py fails when docs/hooks.md differs from this output.
"""

from __future__ import annotations

import inspect
import re

from dsh import hookspecs

INTRO = """\
# Hook reference

Every hook dsh calls, generated from `dsh/hookspecs.py` by `python docs/gen_hooks.py`
(tests/test_docs.py keeps the two in sync). Hooks are called with keyword arguments; an
implementation names only the arguments it needs, and must not give them defaults. Mark
implementations with `dsh.hookimpl` (the pluggy marker of project `dsh`).

Kinds: **collect** hooks return nothing and take a `register` callback; **firstresult** hooks
stop at the first implementation that returns a value (the built-in one is `trylast`, so any
plugin wins); **wrappers** (`@hookimpl(wrapper=True)`) are welcome on `request` and `execute`,
the two onion chains; **historic** hooks reach plugins registered late and cannot be wrapped.
"""


def _section(source: str) -> list[tuple[str, list[str]]]:
    """Banner comment titles in order, with the hook names under each."""
    sections: list[tuple[str, list[str]]] = []
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# ---") and i + 1 < len(lines) and lines[i + 1].startswith("# ") \
                and not lines[i + 1].startswith("# ---"):
            sections.append((lines[i + 1][2:].strip(), []))
        m = re.match(r"def (\w+)\(", line)
        if m and sections:
            sections[-1][1].append(m.group(1))
    return sections


def signature(name: str) -> str:
    fn = getattr(hookspecs, name)
    sig = inspect.signature(fn)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{name}({params}) -> {sig.return_annotation}"


def kind(name: str) -> str:
    opts = getattr(getattr(hookspecs, name), "dsh_spec", {})
    kinds = [k for k in ("firstresult", "historic") if opts.get(k)]
    return ", ".join(kinds) or "all results"


def render() -> str:
    out = [INTRO]
    source = inspect.getsource(hookspecs)
    for title, names in _section(source):
        out.append(f"\n## {title}\n")
        for name in names:
            doc = inspect.cleandoc(getattr(hookspecs, name).__doc__ or "")
            out.append(f"### `{signature(name)}`\n")
            out.append(f"*Kind: {kind(name)}.*\n")
            out.append(doc.replace(".. versionadded::", "Added in version") + "\n")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
