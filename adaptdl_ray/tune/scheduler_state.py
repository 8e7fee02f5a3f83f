"""Everything AdaptDLScheduler remembers, as one small JSON-serialisable object.

Tune 2.60 never calls a scheduler's ``save``/``restore``, so the scheduler writes this
state itself into the experiment directory (a ``.json`` file there is uploaded with the
experiment state and downloaded again by ``Tuner.restore``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any

__all__ = ["TrialRecord", "SchedulerState", "STATE_FILE"]

STATE_FILE = "adaptdl_scheduler_state.json"


@dataclasses.dataclass
class TrialRecord:
    """What the scheduler knows about one trial.

    Attributes:
        created: wall-clock time the scheduler first saw the trial (seconds).
        hints: the trial's latest scheduler hints (``SchedHints.to_dict()``), if reported.
        restarts: checkpoint-restarts so far (from the trial's results).
        resize_s: measured seconds its last resize cost, if any.
        launch_s: seconds its latest launch took to its first step (a resize costs at
            least that), if known.
        target: replicas the policy gives it (0: it waits).
        nodes: node ids of the policy's placement, one per replica.
        placed: node ids of its current replicas, as the last allocation assumed them.
        resizes: how many times the scheduler resized it.
        resize_pending: a resize was asked for and its first result has not arrived.
        resize_log: one dict per resize: ``time``, ``from``, ``to`` (replicas),
            ``reason`` (why it pays), ``saved_s`` (predicted seconds saved, growths),
            ``cost_s`` (the resize cost assumed) and, once known, ``measured_s``.
        last_veto: why the latest proposed resize was not made (logged once).
        history: ``[time, replicas]`` pairs, each time its target changed.
        remaining_s: estimated seconds of training left (from its epochs and training
            time so far), if known.
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


@dataclasses.dataclass
class SchedulerState:
    """All trial records (by trial id) and when the cluster was last re-divided."""

    trials: dict[str, TrialRecord] = dataclasses.field(default_factory=dict)
    last_allocation: float = 0.0
    num_allocations: int = 0

    def to_json(self) -> str:
        """Serialise (strict JSON)."""
        return json.dumps({"trials": {k: dataclasses.asdict(v) for k, v in self.trials.items()},
                           "last_allocation": self.last_allocation,
                           "num_allocations": self.num_allocations}, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "SchedulerState":
        """Parse :meth:`to_json` output; unknown record fields are ignored.

        Raises:
            ValueError: malformed JSON or records.
        """
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in dataclasses.fields(TrialRecord)}
        try:
            trials = {k: TrialRecord(**{f: v for f, v in rec.items() if f in known})
                      for k, rec in data.get("trials", {}).items()}
        except TypeError as exc:
            raise ValueError(f"malformed scheduler state: {exc}") from exc
        return cls(trials, float(data.get("last_allocation", 0.0)),
                   int(data.get("num_allocations", 0)))

    def save(self, directory: str) -> str:
        """Write atomically to ``directory/STATE_FILE`` (tmp file + rename); returns the path."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, STATE_FILE)
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
    def load(cls, directory: str) -> "SchedulerState | None":
        """Read ``directory/STATE_FILE``; ``None`` if absent."""
        path = os.path.join(directory, STATE_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return cls.from_json(f.read())
