"""``grep``: ripgrep confined by the sandbox when it can run, else dsh's own search.

**ripgrep** (``rg`` on ``PATH`` and a sandbox that confines): run by
:class:`dsh.sandbox.spawn.Popen` under the agent's policy made read-only (which also keeps
dsh's protected paths unreadable), with dsh's environment allowlist, ``--json``,
``--no-follow``, ``--hidden`` less ``.git``, the same ignore rules as the walk
(``--no-require-git``, no global or ``.ignore`` files; rg also reads the ``.gitignore`` of
folders above the workspace, and a ``glob`` with a '/' is rg's ``--glob``, which searches
ignored files it names), ``--max-filesize`` and a kill at the time bound. ``rg`` follows
its own regex syntax, which is close to Python's.

**dsh's own** (otherwise): dsh walks and reads the files by descriptor
(:mod:`dsh_shell.walk`: ``.gitignore``, no symbolic link, binary and huge files skipped) and
a child interpreter (``python -I -S``, empty environment) matches them: it opens nothing,
getting the pattern and each file's bytes on a pipe. Python's ``re`` has no timeout and a
pattern like ``(a+)+$`` backtracks exponentially on a line of ``a``'s, which no cap on line
length prevents (30 characters are enough), so the bound is time: the child is killed at the
deadline and what it had answered (files in path order) is returned with a note saying the
search was cut and why, or a ToolError when it had found nothing yet.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from collections.abc import Generator
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple

from dsh.core.errors import ToolError
from dsh_shell import search
from dsh_shell import walk as walking
from dsh_shell import workspace

if TYPE_CHECKING:
    import subprocess

    from dsh.sandbox.policy import Policy
    from dsh_shell.settings import ShellSettings

# The matcher, run by ``python -I -S -c``: a JSON header line, then per file ``>II`` (path
# length, data length), the path, the bytes. It answers one JSON line per file with a match
# (its count and the rows to show, [line, is_match, text], at most ``max`` matching lines in
# all), then {"done": true}.
MATCHER = r"""
import json, re, struct, sys
inp, out = sys.stdin.buffer, sys.stdout
head = json.loads(inp.readline())
rx = re.compile(head["pattern"], re.IGNORECASE if head["ignore_case"] else 0)
ctx, left, cols = head["context"], head["max"], head["cols"]
def cut(line, m):
    if len(line) <= cols:
        return line
    start = max(0, m.start() - cols // 4) if m else 0
    text = line[start:start + cols]
    more = len(line) - start - len(text)
    return ("[...] " if start else "") + text + (" [... %d more characters]" % more)
while True:
    h = inp.read(8)
    if len(h) < 8:
        break
    n, size = struct.unpack(">II", h)
    path = inp.read(n).decode()
    lines = inp.read(size).decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    found = {}
    for i, line in enumerate(lines):
        m = rx.search(line)
        if m:
            found[i] = m
    if not found:
        continue
    rows, last = [], -1
    for i in sorted(found)[:max(left, 0)]:
        for j in range(max(i - ctx, last + 1), min(i + ctx, len(lines) - 1) + 1):
            rows.append([j + 1, j in found, cut(lines[j], found.get(j))])
            last = j
    left -= sum(1 for r in rows if r[1])
    out.write(json.dumps({"f": path, "n": len(found), "rows": rows}) + "\n")
    out.flush()
out.write('{"done": true}\n')
"""


class Query(NamedTuple):
    pattern: str
    glob: str | None
    ignore_case: bool
    context: int
    max_results: int


def run_grep(settings: ShellSettings, policy: Policy | None, pattern: str, path: str,
             glob: str | None, ignore_case: bool, context: int, max_results: int) -> str:
    """The ``grep`` tool: checks, then rg or dsh's own search, then :func:`render`."""
    if not isinstance(pattern, str) or not pattern:
        raise ToolError("the pattern is empty: give a regular expression")
    if len(pattern) > search.MAX_PATTERN:
        raise ToolError(f"the pattern is {len(pattern)} characters long; at most "
                        f"{search.MAX_PATTERN} are accepted: search for a shorter one")
    if not 0 <= context <= 10:
        raise ToolError(f"context must be 0 to 10 lines, not {context}")
    if not 1 <= max_results <= search.MAX_RESULTS_LIMIT:
        raise ToolError(f"max_results must be 1 to {search.MAX_RESULTS_LIMIT}, "
                        f"not {max_results}")
    if glob is not None and (not glob.strip() or len(glob) > search.MAX_PATTERN):
        raise ToolError("glob must be a pattern such as \"*.py\"")
    query = Query(pattern, glob, ignore_case, context, max_results)
    root, rel, is_dir = search.start(settings, path)
    seconds, deadline, limit = search.budget(settings)
    import shutil

    rg = shutil.which("rg")
    found: list[dict[str, Any]] | None = None
    notes: list[str] = []
    if rg is not None and policy is not None and policy.confined:
        found, notes = _rg(rg, root, rel, query, policy, seconds, deadline)
    if found is None:
        found, more = _python(root, rel, is_dir, path, query, seconds, deadline)
        notes += more
    return render(found, notes, query, limit, path)


def render(found: list[dict[str, Any]], notes: list[str], query: Query, limit: int,
           path: str) -> str:
    """The matches (``{"f": path, "n": count, "rows": [[line, is_match, text]]}`` per file,
    sorted) as ``path:line:text`` lines (context ``path-line-text``, groups apart ``--``)."""
    lines: list[str] = []
    last: tuple[str, int] | None = None
    total = sum(f["n"] for f in found)
    shown = 0
    for f in found:
        for line, is_match, text in f["rows"]:
            if query.context and last is not None and (last[0] != f["f"] or line > last[1] + 1):
                lines.append("--")
            sep = ":" if is_match else "-"
            lines.append(f"{f['f']}{sep}{line}{sep}{text}")
            shown += bool(is_match)
            last = (f["f"], line)
    if total > shown:
        more = "at least " if any("not searched" in n for n in notes) else ""
        notes.insert(0, f"showing {shown} of {more}{total} matching lines in {len(found)} "
                        "file(s); narrow the pattern, path or glob, or raise max_results")
    if not lines:
        lines.append(f"no matches for {query.pattern!r} in {path!r}")
    return search.answer(lines, notes, limit, "grep")


def _cut(line: str, start: int | None) -> str:
    """A long line cut as the matcher cuts it (around the match)."""
    cols = search.MAX_COLUMNS
    if len(line) <= cols:
        return line
    first = max(0, start - cols // 4) if start is not None else 0
    text = line[first:first + cols]
    more = len(line) - first - len(text)
    return ("[...] " if first else "") + text + f" [... {more} more characters]"


def _timed_out(seconds: float) -> str:
    return (f"stopped after {seconds:g}s, not searched further: the search took too long "
            "(a pattern with nested repetition such as (a+)+ can take exponential time); "
            "simplify the pattern or narrow path or glob")


# --------------------------------------------------------------------------------------------
# dsh's own search
# --------------------------------------------------------------------------------------------


def _files(root: str, rel: str, is_dir: bool, path: str, glob: str | None, deadline: float,
           skipped: dict[str, Any]) -> Generator[tuple[str, int, str], None, None]:
    """``(path, folder descriptor, raw name)`` of each file to search, in path order."""
    from dsh.core import beneath

    if not is_dir:  # one file, named: searched whatever .gitignore or glob say
        parent, _, name = rel.rpartition("/")
        try:
            dfd = beneath.open_dir(root, parent)
        except OSError as exc:
            raise workspace._os_error(path, exc) from None
        try:
            yield rel, dfd, name
        finally:
            os.close(dfd)
        return
    keep = walking.glob_filter(glob)
    walker = walking.Walker(root, rel, max_depth=search.MAX_DEPTH,
                            max_entries=search.MAX_ENTRIES, deadline=deadline)
    skipped["walker"] = walker
    for entry in walker.walk(search.open_start(walker, path)):
        if entry.kind == "link":
            skipped["links"] += 1
        elif entry.kind == "file":
            sub = entry.rel[len(rel) + 1:] if rel else entry.rel
            if keep is None or keep(sub):
                yield entry.rel, entry.dfd, entry.name


def _feed(proc: subprocess.Popen[bytes], head: bytes, first: tuple[str, int, str] | None,
          source: Generator[tuple[str, int, str], None, None],
          skipped: dict[str, Any]) -> None:
    """Write the header and each file's bytes to the matcher (a thread); stops when it is
    killed (a broken pipe)."""
    import itertools
    import struct

    from dsh.core import beneath
    from dsh.core import files

    assert proc.stdin is not None
    total = 0
    try:
        proc.stdin.write(head)
        for name, dfd, raw in itertools.chain([first] if first else [], source):
            try:
                fd = beneath.open_beneath(dfd, raw, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:  # vanished, a symlink swapped in, protected, unreadable
                skipped["unreadable"] += 1
                continue
            try:
                data = files.read_fd(fd, search.MAX_FILE)
            except files.TooLarge:
                skipped["large"].append(name)
                continue
            except OSError:
                skipped["unreadable"] += 1
                continue
            finally:
                os.close(fd)
            if b"\0" in data[:8192]:
                skipped["binary"] += 1
                continue
            total += len(data)
            if total > search.MAX_TOTAL:
                skipped["total"] = name
                break
            encoded = name.encode("utf-8", "replace")
            proc.stdin.write(struct.pack(">II", len(encoded), len(data)) + encoded + data)
    except (OSError, ValueError):  # the matcher was killed: stop
        pass
    except Exception as exc:  # noqa: BLE001 - said in the answer, not lost in a thread
        skipped["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        source.close()
        try:
            proc.stdin.close()
        except OSError:
            pass


def _python(root: str, rel: str, is_dir: bool, path: str, query: Query, seconds: float,
            deadline: float) -> tuple[list[dict[str, Any]], list[str]]:
    import re
    import subprocess
    import threading

    from dsh.sandbox.spawn import INTERPRETER

    try:
        re.compile(query.pattern, re.IGNORECASE if query.ignore_case else 0)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {query.pattern!r}: {exc}") from None
    skipped: dict[str, Any] = {"links": 0, "binary": 0, "large": [], "unreadable": 0,
                               "total": ""}
    source = _files(root, rel, is_dir, path, query.glob, deadline, skipped)
    first = next(source, None)  # a path that cannot be opened is a ToolError here
    head = json.dumps({"pattern": query.pattern, "ignore_case": query.ignore_case,
                       "context": query.context, "max": query.max_results,
                       "cols": search.MAX_COLUMNS}).encode() + b"\n"
    try:
        proc = subprocess.Popen([INTERPRETER, "-I", "-S", "-c", MATCHER],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={}, start_new_session=True,
                                close_fds=True)
    except BaseException:
        source.close()
        raise
    writer = threading.Thread(target=_feed, args=(proc, head, first, source, skipped),
                              name="dsh-grep-feed", daemon=True)
    found: list[dict[str, Any]] = []
    stop, error = _collect(proc, deadline, found.append, writer)
    done = bool(found) and found[-1].get("done")
    found = [f for f in found if "f" in f]
    notes = []
    if stop == "timeout":
        if not found:
            raise ToolError(f"grep found nothing before it was {_timed_out(seconds)}")
        notes.append(_timed_out(seconds))
    elif not done:
        raise ToolError(f"grep failed: {error.splitlines()[-1] if error else 'no answer'}")
    return found, notes + _skip_notes(skipped)


def _skip_notes(skipped: dict[str, Any]) -> list[str]:
    notes = []
    walker = skipped.get("walker")
    if walker is not None:
        notes += [n.replace("not seen", "not searched")
                  for n in search.walk_notes(walker, "later files")]
        if walker.ignored:
            notes.append(f"{walker.ignored} .gitignore'd entries skipped")
    if skipped.get("error"):
        notes.append(f"the search stopped early ({skipped['error']}): later files not searched")
    if skipped["total"]:
        notes.append(f"stopped at {skipped['total']} after {_size(search.MAX_TOTAL)}: "
                     "later files not searched")
    if skipped["binary"]:
        notes.append(f"{skipped['binary']} binary file(s) skipped")
    big = skipped["large"]
    if big:
        notes.append(f"{len(big)} file(s) over {_size(search.MAX_FILE)} skipped ("
                     + ", ".join(big[:3]) + (", …" if len(big) > 3 else "") + ")")
    if skipped["links"]:
        notes.append(f"{skipped['links']} symlink(s) not followed")
    if skipped["unreadable"]:
        notes.append(f"{skipped['unreadable']} file(s) could not be read")
    return notes


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


def _collect(proc: subprocess.Popen[bytes], deadline: float,
             take: Callable[[dict[str, Any]], None], writer: Any = None,
             cap: int = 64 << 20) -> tuple[str | None, str]:
    """Each JSON line ``proc`` prints to ``take`` until its output ends, the deadline
    (``"timeout"``), more than ``cap`` bytes (``"output"``) or the run's abort; then the
    process (its group) is killed. Returns the reason and the start of its stderr."""
    import select

    from dsh.host.runcontext import current_or_none
    from dsh_shell import process

    assert proc.stdout is not None and proc.stderr is not None
    ctx = current_or_none()
    forget = ctx.cancel.on_cancel(lambda: process.kill_group(proc)) if ctx is not None else None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    fds = {out, err}
    buf, errors, size, stop = b"", b"", 0, None
    try:
        if writer is not None:
            writer.start()
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                stop = "timeout"
                break
            ready, _, _ = select.select(list(fds), [], [], min(left, 0.1))
            for fd in ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    fds.discard(fd)
                elif fd == err:
                    errors = (errors + data)[:8192]
                else:
                    size += len(data)
                    buf += data
                    *complete, buf = buf.split(b"\n")
                    for line in complete:
                        try:
                            take(json.loads(line))
                        except ValueError:
                            continue
            if size > cap:
                stop = "output"
                break
    finally:
        if forget is not None:
            forget()
        process.kill_group(proc)
        proc.wait()
        if writer is not None and writer.is_alive():
            writer.join(5)
        proc.stdout.close()
        proc.stderr.close()
    if ctx is not None and ctx.cancel.cancelled:
        raise ToolError("grep was stopped: the run was aborted")
    return stop, errors.decode("utf-8", "replace").strip()


# --------------------------------------------------------------------------------------------
# ripgrep
# --------------------------------------------------------------------------------------------


def _rg_argv(rg: str, rel: str, query: Query) -> list[str]:
    argv = [rg, "--json", "--no-config", "--no-follow", "--hidden", "--glob", "!.git",
            "--no-require-git", "--no-ignore-global", "--no-ignore-dot",
            "--max-filesize", str(search.MAX_FILE), "--sort", "path"]
    if query.ignore_case:
        argv.append("--ignore-case")
    if query.context:
        argv += ["--context", str(query.context)]
    glob = query.glob
    if glob and "/" not in glob:
        # A file type, not --glob: rg's --glob overrides .gitignore, a type only narrows.
        negate = glob.startswith("!")
        argv += ["--type-add", f"dshglob:{glob[1:] if negate else glob}",
                 "--type-not" if negate else "--type", "dshglob"]
    elif glob:  # a path glob: rg's own, which also searches ignored files it names
        argv += ["--glob", glob]
    return [*argv, "--regexp", query.pattern, "--", rel or "."]


def _text(obj: dict[str, Any] | None) -> str:
    """rg's ``{"text": …}`` or ``{"bytes": base64}``."""
    if not obj:
        return ""
    if "text" in obj:
        return str(obj["text"])
    import base64

    return base64.b64decode(obj.get("bytes", "")).decode("utf-8", "replace")


def _rg(rg: str, root: str, rel: str, query: Query, policy: Policy, seconds: float,
        deadline: float) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """rg's matches as :func:`render` takes them; ``(None, note)`` when the sandbox cannot
    confine it (dsh's own search runs instead)."""
    import subprocess

    import attrs

    from dsh.core.errors import ConfigError
    from dsh.sandbox.spawn import Popen
    from dsh.sandbox.spawn import SandboxUnavailable
    from dsh_shell import process

    if policy.mode == "workspace-write":  # a search writes nothing
        policy = attrs.evolve(policy, mode="read-only", write=())
    process.harden_process()
    try:
        proc = Popen(_rg_argv(rg, rel, query), policy, workspace=root, cwd=root,
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     start_new_session=True, env=process.child_env((), root))
    except (SandboxUnavailable, ConfigError, OSError) as exc:
        return None, [f"rg could not run confined ({exc}); searched without it"]
    process.record_sandbox(proc.sandbox)
    found: list[dict[str, Any]] = []
    state = {"shown": 0, "last": -1}
    limit = query.max_results

    def take(msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind not in ("match", "context"):
            return
        data = msg.get("data") or {}
        name = walking.shown(_text(data.get("path")).removeprefix("./"))
        line = int(data.get("line_number") or 0)
        if not found or found[-1]["f"] != name:
            found.append({"f": name, "n": 0, "rows": []})
            state["last"] = -1
        entry = found[-1]
        is_match = kind == "match"
        entry["n"] += is_match
        if is_match and state["shown"] >= limit:
            return
        if not is_match and state["shown"] >= limit and line > state["last"] + query.context:
            return
        subs = data.get("submatches") or [{}]
        text = _text(data.get("lines")).rstrip("\n").rstrip("\r")
        entry["rows"].append([line, is_match, _cut(text, subs[0].get("start"))])
        if is_match:
            state["shown"] += 1
            state["last"] = line

    stop, error = _collect(proc, deadline, take)
    found = [f for f in found if f["n"]]
    notes = []
    if stop == "timeout":
        if not found:
            raise ToolError(f"grep found nothing before it was {_timed_out(seconds)}")
        notes.append(_timed_out(seconds))
    elif stop == "output":
        notes.append("rg printed too much: later files not searched")
    elif proc.returncode == 2 or (proc.returncode not in (0, 1) and not found):
        first = " ".join(error.split())[:600] if error else f"exit code {proc.returncode}"
        if not found:
            raise ToolError(f"grep (rg) failed: {first}")
        notes.append(f"rg reported: {first}")
    return found, notes
