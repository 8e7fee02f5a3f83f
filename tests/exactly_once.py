"""The exactly-once check shared by the elastic (processes) and Ray Tune tests: from the
batch records of every replica and restart, every epoch saw every sample exactly once."""

from __future__ import annotations

import collections


def samples_per_epoch(events: list[dict]) -> dict:
    """epoch -> Counter of sample indices trained on, over all replicas and restarts
    (``events`` with ``"event": "batch"`` carry ``epoch`` and the batch's ``idx``)."""
    seen = collections.defaultdict(collections.Counter)
    for e in events:
        if e["event"] == "batch":
            seen[e["epoch"]].update(e["idx"])
    return seen


def assert_exactly_once(events: list[dict], size: int, epochs: int) -> None:
    """Epochs 0 .. epochs-1 each trained on samples 0 .. size-1 exactly once."""
    seen = samples_per_epoch(events)
    assert sorted(seen) == list(range(epochs))
    for epoch, counts in seen.items():
        assert set(counts) == set(range(size)), f"epoch {epoch}: samples missing"
        repeated = {i: c for i, c in counts.items() if c != 1}
        assert not repeated, f"epoch {epoch}: samples seen more than once: {repeated}"
