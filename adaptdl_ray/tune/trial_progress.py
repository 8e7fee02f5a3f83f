"""What an AdaptDL trial remembers across relaunches, saved in every checkpoint it writes.

:class:`TrialProgress` is a plain JSON-serialisable record owned by the trainable: how often
the trial was launched, whether its function finished, the counters Tune shows
(``training_iteration``, ``time_total_s``), the order of its result keys, and the reports its
replicas made before the checkpoint but Tune has not received yet (``pending``; replayed after
a restore, so no report is lost or repeated).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ray.tune.result import DONE, SHOULD_CHECKPOINT, TIME_THIS_ITER_S

from adaptdl_ray.tune.results import order_like

__all__ = ["TrialProgress", "PendingReport"]


@dataclasses.dataclass
class PendingReport:
    """One report of rank 0 that Tune has not received yet.

    Attributes:
        metrics: the result as it will reach Tune (user metrics and ``adaptdl/`` keys).
        tag: in-place checkpoints rank 0 had completed when it made the report (a report
            with ``tag < k`` was made before the ``k``-th checkpoint of the launch).
        user_checkpoint: the user's checkpoint files (tar bytes), if the report carried one.
    """

    metrics: dict[str, Any]
    tag: int = 0
    user_checkpoint: bytes | None = None


@dataclasses.dataclass
class TrialProgress:
    """The trial's persistent record.

    Attributes:
        seq: AdaptDL checkpoints written so far (Tune's and those saved on an interrupt); a
            restore takes the one with the highest ``seq``.
        restarts: launches of the training function so far, minus one.
        finished: the training function returned.
        resize_s: seconds the latest relaunch cost (pause to first step), 0 before any.
        pause: wall-clock times of the checkpoint this record was saved with:
            ``requested``, ``stopped`` (the replicas saved), ``saved`` (written out).
        iteration, time_total_s: Tune's ``training_iteration`` and ``time_total_s`` of the
            last report handed to Tune.
        user_checkpoints: reports that carried a user checkpoint.
        schema: the keys of the trial's first result, in order (every later result lists
            its keys in this order, so ``progress.csv`` rows line up with its header).
        pending: reports made before the checkpoint that Tune has not received (their
            user checkpoints, if any, are stored beside the record).
        nodes_lost: nodes lost under the trial's replicas that it continued after (from its
            newest checkpoint, in the same trial).
    """

    seq: int = 0
    restarts: int = 0
    finished: bool = False
    resize_s: float = 0.0
    pause: dict[str, float] | None = None
    iteration: int = 0
    time_total_s: float = 0.0
    user_checkpoints: int = 0
    schema: list[str] = dataclasses.field(default_factory=list)
    pending: list[PendingReport] = dataclasses.field(default_factory=list)
    nodes_lost: int = 0

    def tune_result(self, report: PendingReport, *, final: bool, failed: bool) -> dict:
        """The result Tune receives for ``report``, counted in this record (iteration,
        ``time_total_s``, user checkpoints; the first result fixes the key order).

        Args:
            final: the function's last report: it is marked done, and it carries the final
                state as a checkpoint when the user never checkpointed (so that
                ``result.checkpoint`` holds the trained model).
            failed: a replica failed: no fresh state can be taken, so no report asks Tune
                to checkpoint (the retry starts from the last checkpoint)."""
        row = dict(report.metrics)
        checkpoint = report.user_checkpoint is not None
        if checkpoint:
            self.user_checkpoints += 1
        elif final and self.user_checkpoints == 0:
            checkpoint = True
        row[SHOULD_CHECKPOINT] = checkpoint and not failed
        row[DONE] = final or bool(row.get(DONE, False))
        row[TIME_THIS_ITER_S] = row.pop(TIME_THIS_ITER_S)
        if not self.schema:
            self.schema = list(row)
        self.iteration += 1
        self.time_total_s += row[TIME_THIS_ITER_S]
        return order_like(row, self.schema)

    def to_json(self) -> str:
        """Serialise (user checkpoints of pending reports are left out: stored beside)."""
        data = dataclasses.asdict(self)
        data["pending"] = [{"metrics": p.metrics, "tag": p.tag,
                            "has_user_checkpoint": p.user_checkpoint is not None}
                           for p in self.pending]
        return json.dumps(data, default=_jsonable)

    @classmethod
    def from_json(cls, text: str) -> "TrialProgress":
        """Parse :meth:`to_json` output (pending user checkpoints come back as ``None``:
        the caller fills them in from the files beside the record).

        Raises:
            ValueError: malformed JSON or fields.
        """
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            pending = [PendingReport(dict(p["metrics"]), int(p.get("tag", 0)))
                       for p in data.get("pending", [])]
            fields = {k: v for k, v in data.items() if k in known and k != "pending"}
            return cls(**fields, pending=pending)
        except (TypeError, KeyError) as exc:
            raise ValueError(f"malformed AdaptDL trial record: {exc}") from exc

    @staticmethod
    def pending_flags(text: str) -> list[bool]:
        """Which pending reports of a serialised record carried a user checkpoint."""
        return [bool(p.get("has_user_checkpoint")) for p in json.loads(text).get("pending", [])]


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays as plain numbers and lists; anything else as its repr."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return repr(value)
