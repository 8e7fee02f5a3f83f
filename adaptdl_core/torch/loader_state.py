"""The adaptive data loader's saved position, and the checks that keep it possible.

:class:`LoaderState` is the loader's :class:`~adaptdl_core.torch.elastic_loop.LoopState`
(the position in the current loop, the loops finished, the batch configuration) saved
with what bounds it: the dataset length and the batch size limits, read from the
loader's :class:`~adaptdl_core.torch.batch_control.BatchSizeController` (the one place
they are held). A restore checks the saved position against those bounds before the
position is used (:func:`check_saved_position`, registered as the checkpoint's content
check for every loader state).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from adaptdl_core import checkpoint, validation
from adaptdl_core.torch.batch_control import BatchSizeController
from adaptdl_core.torch.elastic_loop import LoopState

__all__ = ["LoaderState", "STATE_PREFIX", "position_limit", "check_saved_position"]

LOG = logging.getLogger(__name__)

STATE_PREFIX = "adaptdl-dataloader-"


def position_limit(dataset_len: int, batch_size: int, max_batch_size: int | None) -> int:
    """The largest global position (samples consumed in one loop) a loader can reach.

    A loop with a fixed batch size makes one pass: at most ``dataset_len``. An autoscaled
    training loop lasts one pass's statistical progress, and each optimizer step of
    ``M`` samples makes at least ``min(M, M0) / M0`` steps of progress (``M0`` =
    ``batch_size``; AdaScale's gain is at least 1 for ``M >= M0``), so it consumes at most
    ``dataset_len * max_batch_size / M0`` samples plus the step that crosses the target;
    the limit doubles that, plus one pass, for the passes that end on a partial batch.

    Raises:
        ValueError: for a dataset length < 0 or batch sizes < 1.
    """
    validation.integer("dataset_len", dataset_len, low=0)
    validation.integer("batch_size", batch_size, low=1)
    if max_batch_size is None:
        return dataset_len
    validation.integer("max_batch_size", max_batch_size, low=1)
    ratio = math.ceil(max(max_batch_size, batch_size) / batch_size)
    return 2 * (dataset_len * ratio + max_batch_size) + dataset_len


def _is_count(value: Any, least: int) -> bool:
    """Whether ``value`` is an int (not a bool) >= ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_saved_position(data: bytes) -> None:
    """Content check of a saved loader state (see checkpoint.register_content_check):
    the position must be one the loader could have reached."""
    saved = json.loads(data.decode("utf-8"))
    index = saved.get("current_index")
    if not _is_count(index, 0):
        raise ValueError(f"current_index={index!r} is not a position (an integer >= 0)")
    if saved.get("local_bsz") is not None and not _is_count(saved["local_bsz"], 1):
        raise ValueError(f"local_bsz={saved['local_bsz']!r} is not a batch size (>= 1)")
    if not _is_count(saved.get("accum_steps", 0), 0):
        raise ValueError(f"accum_steps={saved.get('accum_steps')!r} is not a count (>= 0)")
    limits = saved.get("limits")
    if limits is None:
        return  # (saved before the limits were recorded: position unchecked)
    n, bsz, max_bsz = limits.get("dataset_len"), limits.get("batch_size"), \
        limits.get("max_batch_size")
    if not (_is_count(n, 0) and _is_count(bsz, 1)
            and (max_bsz is None or _is_count(max_bsz, 1))):
        raise ValueError(f"limits={limits!r} are not a dataset length and batch sizes")
    limit = position_limit(n, bsz, max_bsz)
    if index > limit:
        scope = "one pass" if max_bsz is None else \
            f"an autoscaled epoch with batches up to {max_bsz}"
        raise ValueError(f"current_index={index} is past the end of the epoch: {scope} over "
                         f"{n} samples reaches at most {limit}")


checkpoint.register_content_check(STATE_PREFIX, check_saved_position)


class LoaderState(LoopState):
    """The loader's position (a :class:`LoopState`) saved together with what bounds it:
    the dataset length and the batch sizes, so that a restore can tell an impossible
    position from a real one before it uses the checkpoint."""

    def __init__(self, name: str, dataset_len: int, control: BatchSizeController):
        super().__init__(name)
        self.dataset_len = dataset_len
        self.control = control  # (the batch size limits: read when saved)

    def to_dict(self) -> dict[str, Any]:
        """The position (:meth:`LoopState.to_dict`) and its limits, as saved."""
        return {**super().to_dict(),
                "limits": {"dataset_len": self.dataset_len,
                           "batch_size": self.control.init_batch_size,
                           "max_batch_size": self.control.max_batch_size}}

    def from_dict(self, data: dict[str, Any]) -> None:
        """Take the saved position; the limits stay this run's (set by the loader).

        Raises:
            ValueError: if the position is inside a loop over a dataset of another
                length than this run's (its samples cannot be mapped onto this one's:
                some would be skipped or repeated); the message names both lengths.
        """
        super().from_dict(data)
        saved = (data.get("limits") or {}).get("dataset_len")
        if saved is None or saved == self.dataset_len:
            return
        if self.current_index > 0:
            raise ValueError(
                f"the checkpoint was taken {self.current_index} samples into a loop over a "
                f"dataset of {saved} samples, but this run's dataset has {self.dataset_len}: "
                "the position cannot be carried over (samples would be skipped or "
                "repeated); resume with the same dataset, or start from an empty "
                "checkpoint directory")
        # Between loops nothing depends on the old length: the new dataset is used.
        LOG.warning("%s: the dataset has %d samples, the checkpoint's had %d; no loop was "
                    "in progress, so the next loop uses the new dataset", self.name,
                    self.dataset_len, saved)
