"""Everything the decision core remembers, as one plain JSON-serialisable object.

:class:`CoreState` maps job ids to :class:`JobRecord` (under the JSON key ``"jobs"``; a
state file written before, with the key ``"trials"``, still loads; fields a file lacks take
their defaults, fields this version does not know are ignored).
:class:`StateWriter` writes snapshots of it from a background thread, so that a front-end's
event loop never waits for the disk.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import tempfile
import threading
import warnings
from typing import Any

LOG = logging.getLogger(__name__)

__all__ = ["JobRecord", "CoreState", "StateWriter", "write_atomic"]


def write_atomic(directory: str, name: str, text: str) -> str:
    """Write ``text`` to ``directory/name`` atomically (a temporary file in the same
    directory, then a rename): a reader, or a crash, sees the old file or the new one,
    never half of one. Returns the path.

    Raises:
        OSError: the directory cannot be created or written."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".adaptdl-state-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


@dataclasses.dataclass
class JobRecord:
    """What the core knows about one job.

    Attributes:
        created: clock time the core first saw the job (seconds).
        hints: the job's latest scheduler hints (``SchedHints.to_dict()``), if reported.
        restarts: checkpoint-restarts so far (from the job's progress).
        resize_s: measured seconds its last resize cost, if any.
        launch_s: seconds its latest launch took to its first step (a resize costs at
            least that), if known.
        target: replicas the policy gives it (0: it waits).
        nodes: node ids of the policy's placement, one per replica.
        placed: node ids of its current replicas (reported by the front-end, or the
            core's guess when only the count is known).
        resizes: how many times it was resized.
        resize_pending: a resize was begun and the progress after it has not arrived.
        cost_pending: the relaunch of a resize began (its restarts grew) and its measured
            cost has not arrived yet (a front-end may see the relaunch before its first
            step).
        resize_log: one dict per resize: ``time``, ``from``, ``to`` (replicas),
            ``reason`` (why it pays), ``saved_s`` (predicted seconds saved, growths),
            ``cost_s`` (its predicted cost), ``cost_basis`` (what the prediction rests
            on) and, once known, ``measured_s`` (its measured cost).
        last_veto: why the latest proposed resize was not made (logged once).
        held: why the latest solve kept it below its maximum while the cluster had room
            for more of it (see :mod:`adaptdl_core.decision.held`), else ``None``.
        history: ``[time, replicas]`` pairs, each time its target changed.
        remaining_s: estimated seconds of training left, if known.
        spec: the job's :class:`~adaptdl_core.decision.JobSpec` as a dict (``None`` in
            state files written before the core existed, until the job is added again).
        current: replicas it holds now (0: not running).
        placed_known: ``placed`` came from the front-end (else it is a guess).
        live: the job is added and not removed (restored records stay not live until
            the front-end adds them again).
        name: how people know the job (a Tune trial's name; ``None``: its id).
        hints_by_type: on a cluster of several accelerator types, its latest hints with
            a throughput fit on each type it reported from (type -> hints).
        restarting: the front-end reported it checkpointing or relaunching.
    """

    created: float
    hints: dict | None = None
    restarts: int = 0
    resize_s: float | None = None
    launch_s: float | None = None
    target: int = 0
    nodes: list = dataclasses.field(default_factory=list)
    placed: list = dataclasses.field(default_factory=list)
    resizes: int = 0
    resize_pending: bool = False
    cost_pending: bool = False
    resize_log: list = dataclasses.field(default_factory=list)
    last_veto: str | None = None
    held: str | None = None
    history: list = dataclasses.field(default_factory=list)
    remaining_s: float | None = None
    spec: dict | None = None
    current: int = 0
    placed_known: bool = False
    live: bool = False
    name: str | None = None
    hints_by_type: dict = dataclasses.field(default_factory=dict)
    restarting: bool = False


@dataclasses.dataclass
class CoreState:
    """All job records (by job id) and when the policy last re-divided the cluster.

    Attributes:
        jobs: job id -> :class:`JobRecord`.
        last_allocation: clock time of the latest solve (seconds).
        num_allocations: solves so far.
    """

    jobs: dict[str, JobRecord] = dataclasses.field(default_factory=dict)
    last_allocation: float = 0.0
    num_allocations: int = 0

    #: File name used by :meth:`save` and :meth:`load`.
    FILE = "adaptdl_scheduler_state.json"

    @property
    def trials(self) -> dict[str, JobRecord]:
        """Deprecated name of :attr:`jobs` (the state is the core's, which speaks of jobs;
        a Tune trial is one kind of job)."""
        warnings.warn("CoreState.trials is deprecated: use CoreState.jobs (the same dict)",
                      DeprecationWarning, stacklevel=2)
        return self.jobs

    def to_json(self) -> str:
        """Serialise (strict JSON; job ids become strings)."""
        # vars(), not dataclasses.asdict(): the fields are JSON values already, and the
        # deep copy asdict makes is most of the cost of a write.
        return json.dumps({"jobs": {str(k): vars(v) for k, v in self.jobs.items()},
                           "last_allocation": self.last_allocation,
                           "num_allocations": self.num_allocations},
                          allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "CoreState":
        """Parse :meth:`to_json` output; unknown record fields are ignored, missing ones
        take their defaults (older state files load).

        Raises:
            ValueError: malformed JSON or records.
        """
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("malformed scheduler state: not a JSON object")
        known = {f.name for f in dataclasses.fields(JobRecord)}
        # "trials": the key of state files written before the core spoke of jobs.
        records = data["jobs"] if "jobs" in data else data.get("trials", {})
        try:
            jobs = {k: JobRecord(**{f: v for f, v in rec.items() if f in known})
                    for k, rec in records.items()}
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"malformed scheduler state: {exc}") from exc
        return cls(jobs, float(data.get("last_allocation", 0.0)),
                   int(data.get("num_allocations", 0)))

    def save(self, directory: str) -> str:
        """Write atomically to ``directory/FILE`` (tmp file + rename); returns the path.

        Raises:
            OSError: the directory cannot be written."""
        return write_atomic(directory, self.FILE, self.to_json())

    @classmethod
    def load(cls, directory: str) -> "CoreState | None":
        """Read ``directory/FILE``; ``None`` if absent.

        Raises:
            ValueError: malformed content; OSError: unreadable file."""
        path = os.path.join(directory, cls.FILE)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return cls.from_json(f.read())


class StateWriter:
    """Writes :class:`CoreState` snapshots to ``directory/CoreState.FILE`` in a background
    thread, newest first: a snapshot submitted while an older one is being written
    replaces any snapshot still waiting, so a burst of submissions costs at most two
    writes and the file always ends at the newest one.

    The caller serialises (:meth:`CoreState.to_json`) in its own thread, so each snapshot
    is consistent; only the file work (which releases the interpreter lock and, beside a
    busy solve thread, may take far longer) moves to the writer thread
    (``benchmarks/scheduler_hooks.py`` times the hooks that submit snapshots). Each write is atomic (:func:`write_atomic`):
    a crash of the process loses at most the snapshots not yet written, never the file.
    The thread is started on the first submission and finishes its pending write before
    the interpreter exits.

    Args:
        sync: write in the submitting thread instead (deterministic; for tests).
    """

    def __init__(self, sync: bool = False) -> None:
        self.sync = bool(sync)
        self._cond = threading.Condition()
        self._pending: tuple[str, str] | None = None
        self._busy = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: Snapshots written so far, and writes that failed (each failure is logged).
        self.writes = 0
        self.failures = 0

    def __getstate__(self) -> dict:
        # Front-ends are pickled with their configuration; threads and locks stay behind.
        return {"sync": self.sync, "writes": self.writes, "failures": self.failures}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state.get("sync", False))
        self.writes, self.failures = state.get("writes", 0), state.get("failures", 0)

    @property
    def busy(self) -> bool:
        """Whether a snapshot is being written or waits to be."""
        return self._busy

    def submit(self, directory: str, text: str) -> None:
        """Write ``text`` (a :meth:`CoreState.to_json` snapshot) to ``directory`` soon; with
        ``sync``, now. A failure is logged, not raised (the next snapshot tries again).

        Raises:
            TypeError: ``directory`` or ``text`` is not a string."""
        if not isinstance(directory, str) or not isinstance(text, str):
            raise TypeError(f"submit(directory, text) takes two strings, got "
                            f"{type(directory).__name__} and {type(text).__name__}")
        with self._cond:
            self._pending = (directory, text)
            if self._busy:
                return  # the running drain picks it up
            self._busy = True
            if not self.sync:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        1, thread_name_prefix="adaptdl-state-writer")
                self._executor.submit(self._drain)
                return
        self._drain()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted snapshot is written (at most ``timeout`` seconds;
        ``None``: as long as it takes). Returns ``True`` if nothing is left to write."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy, timeout)

    def _drain(self) -> None:
        while True:
            with self._cond:
                item, self._pending = self._pending, None
                if item is None:
                    self._busy = False
                    self._cond.notify_all()
                    return
            try:
                write_atomic(item[0], CoreState.FILE, item[1])
                self.writes += 1
            except Exception as exc:  # noqa: BLE001 - logged; the next snapshot retries
                self.failures += 1
                LOG.warning("could not save the scheduler state to %s: %s", item[0], exc)
            except BaseException:
                with self._cond:  # e.g. Ctrl-C during a sync write: do not stay busy
                    self._busy = False
                    self._cond.notify_all()
                raise
