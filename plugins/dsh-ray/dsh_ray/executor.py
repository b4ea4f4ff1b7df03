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
* ``ledgers = "ship"``: the ledgers, and the attachments they reference, travel between the
  workers and the driver's store through a :class:`dsh_ray.ship.LedgerSink` actor
  (:mod:`dsh_ray.ship`). The batch's actors are placed on the driver's node, so a worker
  node lost mid-batch takes none of the batch's state with it.
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
from dsh_ray import ship
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
    #: Called before each reservation and each usage sent (``ledgers = "ship"``: the
    #: ledger's new lines are shipped first, so the budget never counts a step, request or
    #: tool call whose ledger lines before it are not at the driver).
    before: Callable[[], None] | None = attrs.field(default=None, repr=False)

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
        if self.before is not None:
            self.before()
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
            if self.before is not None:
                self.before()
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


class Watch:
    """Stops or aborts a worker's run when the driver's batch stops (read from the actor on
    every budget call, and every :data:`POLL` seconds while the run lasts); ships the
    ledger's new lines as often, with ``ledgers = "ship"``."""

    def __init__(self, budget: RayBudget, shipper: ship.Shipper | None = None) -> None:
        self.budget = budget
        self.shipper = shipper
        self.ctx: RunContext | None = None
        self._done = threading.Event()

    def attach(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.budget.on_state = self.apply
        if self.shipper is not None:
            self.budget.before = self.shipper.flush_now
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


def run_remote(unit: Unit, budget: RayBudget, marker: str | None = None, sink: Any = None,
               prior: bytes | None = None, blobs: dict[str, bytes] | None = None
               ) -> dict[str, Any]:
    """The Ray task: run ``unit`` here, its budget chained to the batch's actor.

    ``marker``: a file the driver made in its session directory. A worker that does not see
    it does not share the driver's filesystem: it refuses the unit (an ``error`` result)
    instead of writing the ledger where the driver will never find it.

    ``sink`` (``ledgers = "ship"``): the ledger is written in a directory of this worker's
    own, starting from ``prior`` (a continued session's ledger, from the driver, with the
    attachments it references: ``blobs``), and streamed to ``sink`` as it grows, with the
    attachments its lines reference (:mod:`dsh_ray.ship`); the local copies are removed at
    the end.
    """
    if sink is not None:
        path = ship.local_store() / f"{unit.session}.jsonl"
        try:
            ship.receive(path, prior, blobs)
            shipper = ship.Shipper(sink, unit.session, path, set(blobs or ()))
            watch = Watch(budget, shipper)
            try:
                return run_unit(attrs.evolve(unit, store=str(path.parent)),
                                budget_parent=budget, context_hook=watch.attach)
            finally:
                shipper.flush(wait=True)
        finally:
            ship.clean(path)
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
        ship_to = Path(unit.store) / f"{unit.session}.jsonl" \
            if self._sink is not None and unit.store is not None else None
        if ship_to is not None:
            prior, blobs = (None, {}) if unit.create else ship.outgoing(ship_to)
            ref = self._remote.remote(unit, self.budget, None, self._sink, prior, blobs)
        else:
            ref = self._remote.remote(unit, self.budget, self._mark(unit.store))
        with self._lock:
            self._refs.add(ref)
        problems: list[str] = []
        try:
            data: dict[str, Any] = ray.get(ref)
        except LOST as exc:
            raise WorkerLost(f"ray: {type(exc).__name__}: {_first_line(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            raise DshError(f"ray worker: {type(cause).__name__}: {_first_line(cause)}") from None
        finally:
            with self._lock:
                self._refs.discard(ref)
            if ship_to is not None:
                problems = ship.land(ship_to, *ray.get(self._sink.take.remote(unit.session)))
        if ship_to is not None:
            data["path"] = str(ship_to)
            if problems:  # the answer is there; the session cannot be resumed as it is
                data.update(outcome="error", reason="dsh-ray: " + "; ".join(problems))
        return data

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
            _quiet_cluster_errors()
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
        here = _on_this_node()
        actor = ray.remote(num_cpus=0, max_restarts=0, **here)(BudgetCounter)
        self._counter = actor.remote(self.budget.limits)
        self.budget.counter = self._counter
        self._remote = ray.remote(max_retries=0, num_cpus=s.task_cpus)(run_remote)
        if s.ledgers == "ship":
            self._sink = ray.remote(num_cpus=0, max_restarts=0, **here)(ship.LedgerSink).remote()

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


def _quiet_cluster_errors() -> None:
    """Keep the cluster's error messages off the driver's stdout (the answer's channel).

    A Ray driver prints every error the cluster publishes (``Raylet is terminated…`` when a
    node dies, with 20 lines of its log) to *stdout*, whatever ``log_to_driver`` says
    (``ray._private.worker.listen_error_messages`` calls the module's ``print_to_stdstream``;
    with ``log_to_driver=False`` nothing else does). They go to the ``dsh_ray.cluster``
    logger instead; the batch reports what they cause itself (a died attempt's journal
    line, the reason on a result line). Without that private function (another Ray),
    nothing is changed."""
    import ray._private.worker as worker

    if hasattr(worker, "print_to_stdstream"):
        log = logging.getLogger("dsh_ray.cluster")

        def to_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
            for line in data.get("lines", ()):
                log.info("%s: %s", data.get("pid"), line)

        worker.print_to_stdstream = to_log


def _on_this_node() -> dict[str, Any]:
    """Ray options placing an actor on the driver's node: the batch's state (the budget,
    shipped ledgers) then dies only with the driver's node, not with a worker node lost
    mid-batch. Empty where the driver's node is not known (Ray Client)."""
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - no node of its own: Ray places the actors
        return {}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
