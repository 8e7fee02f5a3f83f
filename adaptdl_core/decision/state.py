"""Everything the decision core remembers, as one plain JSON-serialisable object.

:class:`CoreState` maps job ids to :class:`JobRecord` (under the JSON key ``"trials"``,
the layout the Tune scheduler has always written, so an existing state file still loads;
fields a file lacks take their defaults, fields this version does not know are ignored).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any

__all__ = ["JobRecord", "CoreState"]


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
        resize_log: one dict per resize: ``time``, ``from``, ``to`` (replicas),
            ``reason`` (why it pays), ``saved_s`` (predicted seconds saved, growths),
            ``cost_s`` (the resize cost assumed) and, once known, ``measured_s``.
        last_veto: why the latest proposed resize was not made (logged once).
        history: ``[time, replicas]`` pairs, each time its target changed.
        remaining_s: estimated seconds of training left, if known.
        spec: the job's :class:`~adaptdl_core.decision.JobSpec` as a dict (``None`` in
            state files written before the core existed, until the job is added again).
        current: replicas it holds now (0: not running).
        placed_known: ``placed`` came from the front-end (else it is a guess).
        live: the job is added and not removed (restored records stay not live until
            the front-end adds them again).
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
    resize_log: list = dataclasses.field(default_factory=list)
    last_veto: str | None = None
    history: list = dataclasses.field(default_factory=list)
    remaining_s: float | None = None
    spec: dict | None = None
    current: int = 0
    placed_known: bool = False
    live: bool = False


@dataclasses.dataclass
class CoreState:
    """All job records (by job id) and when the policy last re-divided the cluster.

    Attributes:
        trials: job id -> :class:`JobRecord` (the name is the state file's).
        last_allocation: clock time of the latest solve (seconds).
        num_allocations: solves so far.
    """

    trials: dict[str, JobRecord] = dataclasses.field(default_factory=dict)
    last_allocation: float = 0.0
    num_allocations: int = 0

    #: File name used by :meth:`save` and :meth:`load`.
    FILE = "adaptdl_scheduler_state.json"

    def to_json(self) -> str:
        """Serialise (strict JSON; job ids become strings)."""
        # vars(), not dataclasses.asdict(): the fields are JSON values already, and the
        # deep copy asdict makes is most of the cost of a write.
        return json.dumps({"trials": {str(k): vars(v) for k, v in self.trials.items()},
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
        try:
            trials = {k: JobRecord(**{f: v for f, v in rec.items() if f in known})
                      for k, rec in data.get("trials", {}).items()}
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"malformed scheduler state: {exc}") from exc
        return cls(trials, float(data.get("last_allocation", 0.0)),
                   int(data.get("num_allocations", 0)))

    def save(self, directory: str) -> str:
        """Write atomically to ``directory/FILE`` (tmp file + rename); returns the path.

        Raises:
            OSError: the directory cannot be written."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, self.FILE)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".adaptdl-state-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

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
