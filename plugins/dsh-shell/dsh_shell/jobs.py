"""Background jobs: ``run_command(background=true)``, ``job_output`` and ``job_kill``.

A job is a command started like any other — the same approval, sandbox, environment and
process group (:func:`dsh_shell.commands.spawn`) — that the call does not wait for: it
returns ``started job N (pid P)`` at once.

* **Its output is read all the time**, by a thread per job, from one pipe (stdout and stderr
  together, in the order they came) into a ring of the last :data:`RING` bytes: a job that
  floods its output never blocks on a full pipe and never grows dsh's memory past the ring.
  ``job_output`` returns what came since the last read, at most ``max_output`` bytes (its
  beginning and its end), and says so when it was cut or when the ring had dropped some.
* **It belongs to the run that started it** (one ``dsh run``, one turn of ``dsh chat``, a
  sub-agent's run): when that run ends, however it ends, every job of it is killed
  (``RunContext.add_cleanup``), with its process group. Under the sandbox with namespaces
  the group holds the relay and the namespace's init, and killing the init ends everything
  in the job's PID namespace, also what left the group (``setsid``, a daemon); if dsh itself
  is killed outright the relay notices (a pidfd) and ends the namespace. Without namespaces
  (the Landlock-only fallback, policy ``off``) a process that left the group escapes.
  Jobs started outside any run are killed when the interpreter exits.
* ``max_jobs`` jobs of a run may be running at once; a job that has exited does not count.

Each start is recorded in the session (``x/shell/job``, with the call's id, the job's number,
its command and pid; then its exit or kill when a call of the run sees it), besides the
sandbox record of the call (``x/shell/sandbox``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from dsh.core.errors import ToolError
from dsh.host.runcontext import current_or_none
from dsh_shell import process

#: Bytes of a job's latest output kept in memory (older output is dropped, and said to be).
RING = 1 << 20
#: ``RunContext.data`` key of a run's jobs.
KEY = "dsh_shell.jobs"
_lock = threading.Lock()
_outside: Table | None = None  # jobs started outside any run


class Ring:
    """The last ``size`` bytes of a stream, and how many came in all (``total``). It grows
    with what comes, up to ``size``, then wraps."""

    def __init__(self, size: int = RING) -> None:
        self.size = size
        self.buf = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        if len(self.buf) < self.size:  # still growing: total == len(buf)
            take = min(len(data), self.size - len(self.buf))
            self.buf += data[:take]
            self.total += take
            data = data[take:]
            if not data:
                return
        if len(data) >= self.size:
            self.total += len(data) - self.size
            data = data[-self.size:]
        at = self.total % self.size
        first = min(len(data), self.size - at)
        self.buf[at:at + first] = data[:first]
        self.buf[:len(data) - first] = data[first:]
        self.total += len(data)

    def since(self, pos: int) -> tuple[int, bytes]:
        """``(dropped, data)``: the bytes from offset ``pos`` on that are still kept, and how
        many after ``pos`` were dropped before them."""
        start = max(pos, self.total - self.size)
        n = self.total - start
        if n <= 0:
            return max(0, start - pos), b""
        at = start % self.size
        first = min(n, self.size - at)
        data = bytes(self.buf[at:at + first]) + bytes(self.buf[:n - first])
        return start - pos, data


class Job:
    """One background command: its process, the thread reading its output, its ring."""

    def __init__(self, number: int, command: str, proc: Any) -> None:
        self.number = number
        self.command = command
        self.proc = proc
        self.ring = Ring()
        self.lock = threading.Lock()
        self.read_pos = 0
        self.killed = False
        self.reported = False  # its end recorded in the session
        self.eof = threading.Event()
        # Held to reap and to kill: a pid is signalled only while it is ours (not reaped).
        self.reap = threading.Lock()
        self.reader = threading.Thread(target=self._read, name=f"dsh-shell-job-{number}",
                                       daemon=True)

    def _read(self) -> None:
        """Read the pipe until every writer is gone (the thread alone closes it)."""
        stream = self.proc.stdout
        fd = stream.fileno()
        try:
            while True:
                try:
                    data = os.read(fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                with self.lock:
                    self.ring.feed(data)
        finally:
            try:
                stream.close()
            except OSError:
                pass
            self.eof.set()

    def returncode(self) -> int | None:
        """The exit status (``Popen.returncode``), or None while it runs. Once it has
        exited, ``wait`` runs too: the sandbox removes the temp directory and moves aside a
        persistence path the job created."""
        with self.reap:
            if self.proc.poll() is None:
                return None
            return int(self.proc.wait())

    def status(self) -> str:
        code = self.returncode()
        if code is None:
            return "running"
        if self.killed:
            return "killed (job_kill)"
        from dsh_shell.commands import describe_exit

        text = describe_exit(code)
        return text.replace("exit code: ", "exited with code ") if code >= 0 else text

    def kill(self) -> None:
        """SIGKILL its process group and reap it (nothing once it has been reaped)."""
        import subprocess

        with self.reap:
            if self.proc.poll() is not None:
                return
            process.kill_group(self.proc)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # a process stuck in the kernel: reaped later
                pass

    def kill_leftovers(self) -> None:
        """The job's command has exited and been reaped, but processes it started in its
        group may live on where there are no namespaces: signal the group while it exists
        (Linux gives no new process a pid still in use as a process group's id)."""
        import signal

        try:
            os.killpg(self.proc.pid, 0)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Table:
    """The jobs of one run (or of the process, outside any run)."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.next = 1
        self.lock = threading.Lock()
        self.closed = False

    def running(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.returncode() is None]

    def get(self, number: int) -> Job:
        job = self.jobs.get(number) if isinstance(number, int) else None
        if job is None:
            known = ", ".join(map(str, self.jobs)) or "none"
            raise ToolError(f"there is no job {number!r} (jobs of this run: {known})")
        return job

    def close(self) -> None:
        """Kill every job (the run ended), then reap them and let their readers finish."""
        with self.lock:
            self.closed = True
            jobs = list(self.jobs.values())
        for job in jobs:
            if job.returncode() is None:
                job.killed = True
                job.kill()
            elif not job.proc.sandbox.get("namespaces"):
                job.kill_leftovers()
        for job in jobs:
            job.eof.wait(2)


def table(create: bool = False) -> Table | None:
    """The current run's jobs (made, with the cleanup that kills them, when ``create``);
    outside any run, the process's."""
    global _outside
    ctx = current_or_none()
    with _lock:
        if ctx is None:
            if _outside is None and create:
                import atexit

                _outside = Table()
                atexit.register(_outside.close)
            return _outside
        found = ctx.data.get(KEY)
        if found is None and create:
            found = ctx.data[KEY] = Table()
            ctx.add_cleanup(found.close)
        return found


def check_room(max_jobs: int) -> None:
    """Raise :class:`ToolError` when ``max_jobs`` jobs of this run are running."""
    jobs = table()
    running = jobs.running() if jobs is not None else []
    if len(running) >= max_jobs:
        shown = "; ".join(f"{j.number}: {_short(j.command)}" for j in running)
        raise ToolError(f"{len(running)} background jobs are running, the most a run may have "
                        f"(max_jobs = {max_jobs}): stop one with job_kill first ({shown})")


def start(argv: list[str], root: str, settings: Any, policy: Any, shown: str,
          env: dict[str, str]) -> str:
    """Start ``argv`` (approved already) as a job of the current run."""
    import subprocess

    from dsh_shell import commands

    jobs = table(create=True)
    assert jobs is not None
    check_room(settings.max_jobs)
    proc = commands.spawn(argv, root, policy, env, subprocess.STDOUT)
    try:
        process.record_sandbox(proc.sandbox)
        with jobs.lock:
            if jobs.closed:  # the run ended while it started
                raise ToolError("the run has ended: no job may start")
            number = jobs.next
            jobs.next += 1
            job = jobs.jobs[number] = Job(number, shown, proc)
        job.reader.start()
    except BaseException:  # SIGTERM's KeyboardInterrupt, or the run closed: no orphan
        process.kill_group(proc)
        proc.wait()
        raise
    _record(job, "started", command=shown[:2000], pid=proc.pid)
    return (f"started job {number} (pid {proc.pid}): job_output({number}) returns what it "
            f"printed, job_kill({number}) stops it; it is killed when this run ends")


def output(job_id: int, max_output: int) -> str:
    """What job ``job_id`` printed since the last read, and whether it still runs."""
    job = _job(job_id)
    ended = job.returncode() is not None
    if ended:
        job.eof.wait(2)  # what it printed last is read before it is shown
    with job.lock:
        dropped, data = job.ring.since(job.read_pos)
        job.read_pos = job.ring.total
    # The status is the one seen before the read: a job that exits during the read is shown
    # running now and exited (with the rest of its output) by the next call.
    status = job.status() if ended else "running"
    lines = [f"job {job.number}: {status}"]
    if dropped:
        lines.append(f"[… {dropped} bytes of output were dropped before this read: a job "
                     f"keeps only its last {RING} bytes …]")
    if data:
        stream = process.Stream(max_output)
        stream.feed(data)
        note, text = stream.text(max_output)
        lines.append(f"--- new output ({note}) ---" if note else "--- new output ---")
        lines.append(text.rstrip("\n"))
    elif not dropped:
        lines.append("(no new output)")
    if status != "running":
        from dsh_shell.commands import quarantine_note

        note = quarantine_note(job.proc)
        if note:
            lines.append(note)
        _report_end(job)
    return "\n".join(lines)


def kill(job_id: int) -> str:
    """Kill job ``job_id`` with its process group."""
    job = _job(job_id)
    if job.returncode() is not None:
        if not job.proc.sandbox.get("namespaces"):
            job.kill_leftovers()
        text = f"job {job.number} had ended already: {job.status()}"
    else:
        job.killed = True
        job.kill()
        job.eof.wait(2)
        text = f"killed job {job.number} (pid {job.proc.pid}) with its process group"
    _report_end(job)
    with job.lock:
        unread = job.ring.total - job.read_pos
    if unread:
        text += f"; {unread} bytes of its output are unread: job_output({job.number})"
    return text


def kill_all() -> None:
    """Kill every job of the current run (or, outside any run, of the process)."""
    jobs = table()
    if jobs is not None:
        jobs.close()
        with jobs.lock:
            jobs.closed = False  # the table may be used again (tests, a library's loop)


def _job(job_id: int) -> Job:
    jobs = table()
    if jobs is None:
        raise ToolError(f"there is no job {job_id!r}: this run has started none "
                        "(run_command with background=true starts one)")
    return jobs.get(job_id)


def _report_end(job: Job) -> None:
    if job.reported:
        return
    job.reported = True
    code = job.returncode()
    _record(job, "killed" if job.killed else "exited", code=code)


def _record(job: Job, event: str, **data: Any) -> None:
    """``x/shell/job`` in the session: only from a tool call of a run."""
    from dsh.tools.registry import current_call

    try:
        call = current_call()
    except LookupError:
        return
    from dsh.core.errors import NoRunContext
    from dsh.ledger.plugin_events import record_event

    try:
        record_event("shell", "job", {"call_id": call.call.id, "job": job.number,
                                      "event": event, **data})
    except NoRunContext:
        return


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
