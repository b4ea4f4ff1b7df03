"""The Ray executor of ``dsh batch`` (imported only for ``--executor ray``; imports ray).

The driver (the ``dsh batch`` process) keeps what the local executor keeps — the journal,
the results, progress, the session store — and runs each task's job in a thread of its own,
as :class:`dsh.batch.executors.LocalExecutor` does. The job journals the attempt's session, then
hands a :class:`dsh.batch.executors.Unit` to :meth:`RayExecutor.dispatch`, which runs it as a
Ray task (:func:`run_remote`: :func:`dsh.batch.executors.run_unit` on a worker) and waits for
its result.

* The batch's budget is one :class:`BudgetCounter` actor; a worker's run chains its budget to
  a :class:`RayBudget` (a ``Budget`` level with ``remote = True``) whose reserve/add/exceeded
  are calls to it. The actor runs one call at a time, so a reservation is atomic across the
  cluster: requests, steps and tool calls are exact.
* A worker that dies mid-task (killed, out of memory, its node lost) makes ``dispatch`` raise
  :class:`dsh.batch.executors.WorkerLost`; Ray does not retry the task itself
  (``max_retries=0``): the batch closes the partial ledger as interrupted and runs the task
  again in a new session, the journal linking both.
* Stopping (Ctrl-C) and aborting reach the workers through the actor: each running unit
  polls it and stops or aborts its run.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import ClassVar

import attrs
import ray
import ray.exceptions

from dsh.batch.executors import LocalExecutor
from dsh.batch.executors import Unit
from dsh.batch.executors import WorkerLost
from dsh.batch.executors import run_unit
from dsh.batch.tasks import Task
from dsh.core.errors import DshError
from dsh.host.runcontext import Budget
from dsh.host.runcontext import Limits
from dsh.host.runcontext import RunContext
from dsh_ray.settings import Settings

#: How often a running unit asks the actor whether the batch is stopping (seconds).
POLL = 0.5
#: Ray's errors that mean the process (or node) running a task is gone.
LOST = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
        ray.exceptions.TaskCancelledError, ray.exceptions.OutOfMemoryError,
        ray.exceptions.ObjectLostError, ray.exceptions.LocalRayletDiedError,
        ray.exceptions.OwnerDiedError)


# --------------------------------------------------------------------------------------------
# The budget: one actor
# --------------------------------------------------------------------------------------------


_COUNTERS = ("steps", "requests", "tool_calls", "input_tokens", "output_tokens",
             "cache_read_tokens", "cache_write_tokens", "cost")


class BudgetCounter:
    """The batch's budget, in one actor (calls are served one at a time: atomic)."""

    def __init__(self, limits: Limits) -> None:
        self.root = Budget(limits)
        # Reserving through a child names the root's refusals "… in a parent run", as a
        # local batch's do.
        self.child = Budget(parent=self.root)
        self.stopping = ""
        self.aborting = False

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self.root, k) for k in _COUNTERS}
        out["stopping"], out["aborting"] = self.stopping, self.aborting
        return out

    def reserve(self, counts: dict[str, int]) -> tuple[str | None, dict[str, Any]]:
        return self.child.reserve(**counts), self.state()

    def add(self, counts: dict[str, float]) -> dict[str, Any]:
        self.root.add(**counts)
        return self.state()

    def exceeded(self) -> tuple[str | None, dict[str, Any]]:
        return self.child.exceeded(), self.state()

    def stop(self, reason: str, abort: bool) -> None:
        self.stopping = self.stopping or reason
        self.aborting = self.aborting or abort


@attrs.define(eq=False)
class RayBudget(Budget):
    """A budget level whose counters are the :class:`BudgetCounter` actor's (``remote``):
    a run chained to it reserves there. Its own fields mirror the actor's last answer."""

    remote: ClassVar[bool] = True
    counter: Any = None
    #: Called with the actor's state after each call (a worker's stop/abort watch).
    on_state: Callable[[dict[str, Any]], None] | None = attrs.field(default=None, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # The actor handle travels; the lock and the local mirror do not.
        return (RayBudget, (self.limits, None), {"counter": self.counter})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.counter = state["counter"]

    def _seen(self, state: dict[str, Any]) -> None:
        for key in _COUNTERS:
            setattr(self, key, state[key])
        if self.on_state is not None:
            self.on_state(state)

    def reserve(self, **counts: int) -> str | None:
        if self.counter is None:
            return None
        if not self._counted and not self._spent:
            # The batch sets no limit: nothing can refuse, so the counts are sent without
            # waiting (an actor runs one caller's calls in order).
            self.counter.add.remote(counts)
            return None
        reason, state = ray.get(self.counter.reserve.remote(counts))
        self._seen(state)
        return reason

    def add(self, **counts: float) -> None:
        # Usage already spent: recorded without waiting for the answer (limits on tokens and
        # cost are checked by the next reserve, which the actor serves after this add).
        if self.counter is not None:
            self.counter.add.remote(counts)

    def exceeded(self) -> str | None:
        if self.counter is None:
            return None
        reason, state = ray.get(self.counter.exceeded.remote())
        self._seen(state)
        return reason


# --------------------------------------------------------------------------------------------
# The worker's side
# --------------------------------------------------------------------------------------------


class LedgerSink:
    """``ledgers = "ship"``: the ledgers of running units, as their workers stream them."""

    def __init__(self) -> None:
        self.ledgers: dict[str, bytearray] = {}

    def append(self, session: str, offset: int, data: bytes) -> None:
        buf = self.ledgers.setdefault(session, bytearray())
        if offset <= len(buf) < offset + len(data):
            buf += data[len(buf) - offset:]

    def take(self, session: str) -> bytes:
        return bytes(self.ledgers.pop(session, b""))


class Shipper:
    """Streams what a worker's run appends to its local ledger to the :class:`LedgerSink`
    (every :data:`POLL` seconds, and once more, waited for, when the run ends)."""

    def __init__(self, sink: Any, session: str, path: Path) -> None:
        self.sink, self.session, self.path = sink, session, path
        self.offset = 0
        self._lock = threading.Lock()

    def flush(self, *, wait: bool = False) -> None:
        with self._lock:  # sent in offset order (one caller's actor calls run in order)
            try:
                with self.path.open("rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:
                return
            if not data:
                return
            ref = self.sink.append.remote(self.session, self.offset, data)
            self.offset += len(data)
        if wait:
            ray.get(ref)


class Watch:
    """Stops or aborts a worker's run when the driver's batch stops (read from the actor on
    every budget call, and every :data:`POLL` seconds while the run lasts); ships the
    ledger's new lines as often, with ``ledgers = "ship"``."""

    def __init__(self, budget: RayBudget, shipper: Shipper | None = None) -> None:
        self.budget = budget
        self.shipper = shipper
        self.ctx: RunContext | None = None
        self._done = threading.Event()

    def attach(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.budget.on_state = self.apply
        ctx.add_cleanup(self._done.set)
        threading.Thread(target=self._poll, daemon=True, name="dsh-ray-watch").start()

    def apply(self, state: dict[str, Any]) -> None:
        ctx = self.ctx
        if ctx is None or not state["stopping"]:
            return
        if state["aborting"]:
            ctx.abort(state["stopping"])
        else:
            ctx.stop()

    def _poll(self) -> None:
        while not self._done.wait(POLL):
            try:
                if self.shipper is not None:
                    self.shipper.flush()
                self.budget.exceeded()
            except Exception:  # noqa: BLE001 - the driver gone: the run ends on its own
                return


#: How long a worker looks for the driver's marker before refusing (a network filesystem may
#: cache a directory's listing for some seconds: NFS's acdirmin/acdirmax).
MARKER_WAIT = 10.0


def _sees(path: str) -> bool:
    deadline = time.monotonic() + MARKER_WAIT
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


_LOCAL: list[Path] = []


def _local_store() -> Path:
    """This worker process's own session directory (``ledgers = "ship"``)."""
    if not _LOCAL:
        import tempfile

        _LOCAL.append(Path(tempfile.mkdtemp(prefix="dsh-ray-ledgers-")))
    return _LOCAL[0]


def run_remote(unit: Unit, budget: RayBudget, marker: str | None = None, sink: Any = None,
               prior: bytes | None = None) -> dict[str, Any]:
    """The Ray task: run ``unit`` here, its budget chained to the batch's actor.

    ``marker``: a file the driver made in its session directory. A worker that does not see
    it does not share the driver's filesystem: it refuses the unit (an ``error`` result)
    instead of writing the ledger where the driver will never find it.

    ``sink`` (``ledgers = "ship"``): the ledger is written in a directory of this worker's
    own, starting from ``prior`` (a continued session's ledger, from the driver), and
    streamed to ``sink`` as it grows; the local copy is removed at the end.
    """
    if sink is not None:
        path = _local_store() / f"{unit.session}.jsonl"
        if prior is not None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(prior)
        shipper = Shipper(sink, unit.session, path)
        watch = Watch(budget, shipper)
        try:
            return run_unit(attrs.evolve(unit, store=str(path.parent)), budget_parent=budget,
                            context_hook=watch.attach)
        finally:
            shipper.flush(wait=True)
            path.unlink(missing_ok=True)
    if unit.store is not None and marker is not None and not _sees(
            os.path.join(unit.store, marker)):
        from dsh.batch.executors import result_data
        from dsh.run.app import RunResult

        node = os.uname().nodename
        return result_data(RunResult(
            output="", session_id=unit.session, outcome="error",
            reason=f"dsh-ray: the driver's session directory {unit.store} is not shared with "
                   f"this worker (node {node}): the workers must write into it "
                   "(a shared filesystem, docs/ray.md)"))
    watch = Watch(budget)
    return run_unit(unit, budget_parent=budget, context_hook=watch.attach)


# --------------------------------------------------------------------------------------------
# The driver's side
# --------------------------------------------------------------------------------------------


class RayExecutor(LocalExecutor):
    """``--executor ray`` (a :class:`dsh.batch.executors.RemoteExecutor`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.budget: RayBudget | None = None
        self._remote: Any = None
        self._counter: Any = None
        self._owns = False
        self._refs: set[Any] = set()
        self._lock = threading.Lock()
        self._marker: Path | None = None
        self._sink: Any = None

    # -- the contract -------------------------------------------------------------------

    def shared_budget(self, limits: Limits) -> Budget:
        self.budget = RayBudget(limits)  # its actor is made when the first task starts
        return self.budget

    def run(self, job: Callable[[Task], Any], tasks: Iterator[Task], *,
            workers: int) -> Iterator[Any]:
        first = next(tasks, None)
        if first is None:
            return  # nothing to run: no cluster needed
        self.connect()
        for out in super().run(job, itertools.chain([first], tasks), workers=workers):
            if self.budget is not None:
                self.budget.exceeded()  # the driver's mirror, for progress and the summary
            yield out

    def dispatch(self, unit: Unit) -> dict[str, Any]:
        assert self._remote is not None and self.budget is not None
        ship = self._sink is not None and unit.store is not None
        if ship:
            assert unit.store is not None
            path = Path(unit.store) / f"{unit.session}.jsonl"
            prior = path.read_bytes() if not unit.create and path.exists() else None
            ref = self._remote.remote(unit, self.budget, None, self._sink, prior)
        else:
            ref = self._remote.remote(unit, self.budget, self._mark(unit.store))
        with self._lock:
            self._refs.add(ref)
        try:
            data: dict[str, Any] = ray.get(ref)
            if ship:
                data["path"] = str(path)
            return data
        except LOST as exc:
            raise WorkerLost(f"ray: {type(exc).__name__}: {_first_line(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            raise DshError(f"ray worker: {type(cause).__name__}: {_first_line(cause)}") from None
        finally:
            with self._lock:
                self._refs.discard(ref)
            if ship:
                self._land(path, unit.session)

    def stop(self, reason: str, *, abort: bool) -> None:
        if self._counter is None:
            return
        try:
            ray.get(self._counter.stop.remote(reason, abort), timeout=5)
        except Exception:  # noqa: BLE001 - the cluster gone: nothing left to stop
            return
        if abort:  # a run that does not poll in time (a tool blocking): its task goes
            with self._lock:
                refs = list(self._refs)
            timer = threading.Timer(POLL * 6, self._cancel, (refs,))
            timer.daemon = True
            timer.start()

    def close(self) -> None:
        if self._marker is not None:
            self._marker.unlink(missing_ok=True)
            self._marker = None
        if self._sink is not None:
            try:
                ray.kill(self._sink)
            except Exception:  # noqa: BLE001
                pass
            self._sink = None
        if self._counter is not None:
            try:
                ray.kill(self._counter)
            except Exception:  # noqa: BLE001
                pass
            self._counter = None
        if self._owns and ray.is_initialized():
            ray.shutdown()

    # -- helpers ------------------------------------------------------------------------

    def connect(self) -> None:
        """Join the cluster (or start a local one), make the budget's actor."""
        s = self.settings
        if not ray.is_initialized():
            address = s.address or os.environ.get("RAY_ADDRESS") or None
            kwargs: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False,
                                      "runtime_env": s.runtime_env, "namespace": s.namespace}
            if address is None:
                kwargs.update(address="local", num_cpus=s.num_cpus, include_dashboard=False)
            else:
                kwargs["address"] = address
            try:
                ray.init(**kwargs)
            except Exception as exc:
                where = f"at {address}" if address else "(a local Ray)"
                raise DshError(f"dsh-ray: cannot start or join the Ray cluster {where}: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
            self._owns = True
        assert self.budget is not None
        actor = ray.remote(num_cpus=0, max_restarts=0)(BudgetCounter)
        self._counter = actor.remote(self.budget.limits)
        self.budget.counter = self._counter
        self._remote = ray.remote(max_retries=0, num_cpus=s.task_cpus)(run_remote)
        if s.ledgers == "ship":
            self._sink = ray.remote(num_cpus=0, max_restarts=0)(LedgerSink).remote()

    def _land(self, path: Path, session: str) -> None:
        """Write what the workers shipped of ``session`` into the driver's store (a temporary
        file renamed over the ledger: it is whole or absent)."""
        data = ray.get(self._sink.take.remote(session))
        if not data:
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _mark(self, store: str | None) -> str | None:
        """The name of the marker file in the driver's session directory (made once)."""
        if store is None:
            return None
        with self._lock:
            if self._marker is None:
                directory = Path(store)
                directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                marker = directory / f".dsh-ray-{secrets.token_hex(8)}"
                marker.touch(mode=0o600, exist_ok=False)
                self._marker = marker
            return self._marker.name

    def _cancel(self, refs: list[Any]) -> None:
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished
                pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
