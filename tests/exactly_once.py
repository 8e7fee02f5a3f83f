"""The exactly-once check shared by the elastic (processes) and Ray Tune tests: from the
batch records of every replica and restart, every epoch saw every sample exactly once.

An autoscaled training loader's epoch lasts a fixed statistical progress, so with a grown
batch it may pass over the data more than once (``adaptdl_core.torch.step_cycle``): a job
with such a loader records each batch's ``pass`` (``loader.current_index // len(dataset)``
before the batch), and the check then holds per pass: every pass but an epoch's last
covers every sample once, the last covers some samples at most once.
"""

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
    """Epochs 0 .. epochs-1 each trained on samples 0 .. size-1 exactly once (once per
    pass, for batches recorded with their ``pass``; see the module docstring)."""
    seen = samples_per_epoch(events)
    assert sorted(seen) == list(range(epochs))
    passes: dict = collections.defaultdict(lambda: collections.defaultdict(
        collections.Counter))
    for e in events:
        if e["event"] == "batch":
            passes[e["epoch"]][e.get("pass", 0)].update(e["idx"])
    for epoch, counts in seen.items():
        assert set(counts) == set(range(size)), f"epoch {epoch}: samples missing"
        by_pass = passes[epoch]
        last = max(by_pass)
        for number in range(last + 1):
            counts = by_pass.get(number, collections.Counter())
            repeated = {i: c for i, c in counts.items() if c != 1}
            assert not repeated, (f"epoch {epoch}: samples seen more than once"
                                  f"{f' in pass {number}' if last else ''}: {repeated}")
            if number < last:
                assert set(counts) == set(range(size)), \
                    f"epoch {epoch}: pass {number} of {last + 1} missed samples"
