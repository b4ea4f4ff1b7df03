"""``web_fetch`` itself: check the URL, ask for approval, fetch, convert, wrap. Imported at the
first call (it imports httpx, httpcore, and at the first HTML page bs4 and markdownify)."""

from __future__ import annotations

import os
from collections.abc import Callable

from dsh.core.errors import ToolError
from dsh_web import convert
from dsh_web import fetch
from dsh_web.settings import WebSettings

#: The most characters of a URL shown in the approval question and recorded as its subject.
SUBJECT_CAP = 2000


def web_fetch(settings: WebSettings, url: str) -> str:
    """The tool's result for ``url`` (README.md, "What the model gets"); raises ToolError."""
    try:
        fetch.check_url(url)  # before the question: nothing to ask about a file: URL
    except fetch.FetchError as exc:
        raise ToolError(f"web_fetch refused {_shown(url)}: {exc}") from None
    url = url.strip()
    _approve(settings, url)
    try:
        page = fetch.fetch(url, settings, _cancelled())
    except fetch.FetchError as exc:
        raise ToolError(_failure(url, exc)) from None
    notes = []
    if page.redirected_from:
        notes.append(f"redirected from {page.redirected_from[0]}")
    pruned = False
    if page.kind == "html":
        title, text, pruned = convert.html_to_markdown(page.body, page.charset,
                                                       settings.max_output)
        if title:
            text = f"Title: {title}\n\n{text}"
    else:
        text = convert.decode_text(page.body, page.charset)
    text, over = convert.cap(convert.neutralize(text), settings.max_output)
    if page.cut == "max_bytes":
        notes.append(f"the page is longer than {settings.max_bytes} bytes "
                     f"([plugins.web] max_bytes): only its beginning was read")
    elif page.cut == "timeout":
        notes.append(f"the page was still arriving when the time limit of "
                     f"{settings.timeout:g}s was reached ([plugins.web] timeout): only what "
                     f"had arrived is shown")
    if over or pruned:
        notes.append(f"the text was cut at {settings.max_output} characters ([plugins.web] "
                     f"max_output)")
    return convert.wrap(text, url=page.url, status=page.status, media_type=page.media_type,
                        notes=notes)


def _approve(settings: WebSettings, url: str) -> None:
    """dsh's approval service, as dsh-mcp's tools ask it: a fetch leaves the sandbox
    (``outside``: asked in every mode, refused without a terminal unless ``--yes``), or, with
    ``approve = "read"``, reads (runs at once in every mode). Raises ToolError if refused."""
    from dsh.tools import approval

    subject = url if len(url) <= SUBJECT_CAP else (
        url[:SUBJECT_CAP - 30] + f" … [{len(url)} characters]")
    action = "read" if settings.approve == "read" else "outside"
    approval.request(approval.Ask(
        tool="web_fetch", action=action, subject=subject, root=os.getcwd(), verb="fetch",
        always="tool", reason="fetches a web page", terminal=settings.tty))


def _cancelled() -> Callable[[], bool]:
    """Whether the current run was aborted (never, outside a run). A stop (finish the step)
    lets the fetch finish: ``timeout`` bounds it."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        return lambda: False
    return lambda: bool(ctx.cancel.cancelled)


def _failure(url: str, exc: fetch.FetchError) -> str:
    chain = exc.chain or (url,)
    verb = "refused" if isinstance(exc, fetch.Refused) else "could not fetch"
    where = _shown(chain[-1])
    if len(chain) > 1:
        where += f" (redirected from {_shown(chain[0])})"
    return f"web_fetch {verb} {where}: {exc}"


def _shown(url: object, limit: int = 300) -> str:
    text = str(url)
    return text if len(text) <= limit else text[:limit] + "…"
