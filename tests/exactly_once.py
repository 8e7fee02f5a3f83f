"""The exactly-once check shared by the elastic (processes) and Ray Tune tests: from the
batch records of every replica and launch, every epoch saw every sample exactly once,
apart from the padding that evens out a launch's share of a pass.

**The padding rule.** A launch of a job on ``R`` replicas deals the rest of each pass it
trains in to its replicas round-robin, and pads that rest so that it splits evenly, as
torch's ``DistributedSampler`` does (``adaptdl_core.torch.ElasticSampler``): the last
positions repeat samples from the pass's start, at most ``R - 1`` of them. So in every
pass, a sample may be trained on more than once only as such padding: at most ``R - 1``
repeats for each launch that trained in the pass (of its ``R``), and nothing else; and no
sample of an epoch may be missed. A launch is one restart number (``restart`` in the
records of ``tests/core/harness.read_events``, ``restarts`` in the Ray trials'); its
replica count is the ``replicas`` its batch or start records carry, else the number of
ranks that recorded batches in it.

An autoscaled training loader's epoch lasts a fixed statistical progress, so with a grown
batch it may pass over the data more than once (``adaptdl_core.torch.step_cycle``): a job
with such a loader records each batch's ``pass`` (``loader.current_index // len(dataset)``
before the batch), and the check then holds per pass: every pass but an epoch's last
covers every sample, the last may cover only some.
"""

from __future__ import annotations

import collections
from typing import Hashable, Iterable


def samples_per_epoch(events: list[dict]) -> dict:
    """epoch -> Counter of sample indices trained on, over all replicas and restarts
    (``events`` with ``"event": "batch"`` carry ``epoch`` and the batch's ``idx``)."""
    seen = collections.defaultdict(collections.Counter)
    for e in events:
        if e["event"] == "batch":
            seen[e["epoch"]].update(e["idx"])
    return seen


def launch_of(event: dict) -> Hashable:
    """The launch (restart number) that recorded ``event``; ``None`` if it says none."""
    return event.get("restart", event.get("restarts"))


def launch_replicas(events: Iterable[dict]) -> dict:
    """launch -> its replica count: the largest ``replicas`` its records carry, or the
    number of ranks that recorded batches in it, whichever is larger."""
    replicas: dict = collections.defaultdict(int)
    ranks: dict = collections.defaultdict(set)
    for e in events:
        launch = launch_of(e)
        if isinstance(e.get("replicas"), int):
            replicas[launch] = max(replicas[launch], e["replicas"])
        if e["event"] == "batch":
            ranks[launch].add(e.get("rank"))
    return {launch: max(replicas[launch], len(ranks[launch]), 1)
            for launch in set(replicas) | set(ranks)}


def padding_allowance(events: Iterable[dict]) -> dict:
    """(epoch, pass) -> how many repeats the padding rule allows there: ``R - 1`` for
    each launch of ``R`` replicas that trained in that pass."""
    events = list(events)
    replicas = launch_replicas(events)
    launches: dict = collections.defaultdict(set)
    for e in events:
        if e["event"] == "batch":
            launches[e["epoch"], e.get("pass", 0)].add(launch_of(e))
    return {key: sum(replicas[launch] - 1 for launch in found)
            for key, found in launches.items()}


def assert_exactly_once(events: list[dict], size: int, epochs: int, *,
                        padded: bool = True) -> None:
    """Epochs 0 .. epochs-1 each trained on samples 0 .. size-1 exactly once, but for
    the padding the rule allows (see the module docstring; once per pass, for batches
    recorded with their ``pass``). ``padded=False``: no repeat at all (the padding was
    dropped, e.g. with ``drop_padding``)."""
    seen = samples_per_epoch(events)
    assert sorted(seen) == list(range(epochs)), f"epochs trained: {sorted(seen)}"
    allowed = padding_allowance(events) if padded else collections.defaultdict(int)
    passes: dict = collections.defaultdict(lambda: collections.defaultdict(
        collections.Counter))
    for e in events:
        if e["event"] == "batch":
            passes[e["epoch"]][e.get("pass", 0)].update(e["idx"])
    for epoch, counts in seen.items():
        missing = set(range(size)) - set(counts)
        assert not missing, f"epoch {epoch}: samples missing: {sorted(missing)}"
        strange = set(counts) - set(range(size))
        assert not strange, f"epoch {epoch}: samples not in the dataset: {sorted(strange)}"
        by_pass = passes[epoch]
        last = max(by_pass)
        where = lambda number: f" in pass {number}" if last else ""  # noqa: E731
        for number in range(last + 1):
            counts = by_pass.get(number, collections.Counter())
            repeated = {i: c for i, c in counts.items() if c != 1}
            repeats = sum(c - 1 for c in repeated.values())
            limit = allowed.get((epoch, number), 0)
            assert repeats <= limit, (
                f"epoch {epoch}: {repeats} repeated samples{where(number)}, the padding "
                f"rule allows {limit} (replicas - 1 per launch): {repeated}")
            if number < last:
                assert set(counts) == set(range(size)), \
                    f"epoch {epoch}: pass {number} of {last + 1} missed samples"
