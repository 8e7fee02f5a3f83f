"""Adaptive batch size in real processes: it changes, replicas agree, restarts keep it."""

import collections
import json

import pytest

from tests.core.harness import JOBS, read_events, run_json_job, run_replicas

JOB = JOBS / "elastic_job.py"
# A noisy regression (label noise 5): the gradient noise scale grows as training
# converges, so a larger batch soon pays off. Batch 8, at most 64.
ARGS = ["--autoscale", "64", "--noise", "5", "--size", "512", "--epochs", "3"]


def run(replicas, tmp_path, restart, *extra, expect):
    results = run_replicas(JOB, replicas, tmp_path / "ckpt", restart,
                           ["--record", str(tmp_path), *ARGS, *extra], timeout=120)
    for rank, (status, out) in enumerate(results):
        assert status == expect, f"rank {rank} exited {status}:\n{out[-4000:]}"


def batches(events, restart=None, rank=0):
    return [e for e in events if e["event"] == "batch" and e["rank"] == rank
            and (restart is None or e["restart"] == restart)]


def test_batch_size_grows_and_survives_restart(tmp_path):
    # (Stopped at the first batch of a grown size: on this noisy problem the choice may
    # later move back and forth, with the noise estimate.)
    run(1, tmp_path, 0, "--stop-when-grown", expect=143)
    first = batches(read_events(tmp_path), restart=0)
    sizes = [e["batch_size"] for e in first]
    assert sizes[0] == 8
    assert max(sizes) > 8, f"batch size never changed: {sizes}"
    saved = json.loads(next((tmp_path / "ckpt").glob("checkpoint-*/adaptdl-dataloader-0"))
                       .read_text())
    assert saved["local_bsz"] == first[-1]["local_bsz"] > 8

    run(1, tmp_path, 1, expect=0)
    events = read_events(tmp_path)
    second = batches(events, restart=1)
    # The restart starts from the checkpointed choice (re-deciding only if the restored
    # model predicts a >5% gain) instead of falling back to the initial batch of 8.
    assert second[0]["batch_size"] > 8
    # The gain is measured and bounded by the scale.
    for e in second:
        assert 1.0 <= e["gain"] <= e["batch_size"] / 8 + 1e-9
    # Epochs end by statistical progress: a larger batch needs at least one full pass.
    samples = collections.Counter()
    for e in batches(events):
        samples[e["epoch"]] += len(e["idx"])
    assert sorted(samples) == [0, 1, 2]
    assert all(n >= 512 for n in samples.values()), samples


def test_replicas_agree_on_every_batch_size(tmp_path):
    # Replicas agree on a stop request with their side values, up to ~0.2 s or 64 steps
    # later: 30 epochs (>= 240 steps) keep the job from finishing first.
    run(2, tmp_path, 0, "--stop-after", "50", "--epochs", "30", expect=143)
    events = read_events(tmp_path)
    rank0 = [(e["batch_size"], e["local_bsz"]) for e in batches(events, rank=0)]
    rank1 = [(e["batch_size"], e["local_bsz"]) for e in batches(events, rank=1)]
    assert rank0 == rank1
    assert max(size for size, _ in rank0) > 8
    hints = json.loads(next((tmp_path / "ckpt").glob("checkpoint-*/sched-hints.json")).read_text())
    assert hints["max_profiled_replicas"] == 2 and hints["init_batch_size"] == 8
    assert hints["perf_params"] is not None and hints["grad_params"]["var"] > 0


def test_drop_last_with_multi_pass_epochs_terminates(tmp_path):
    # Epochs of adaptive training span several passes; a pass whose remainder is smaller
    # than a batch (dropped) must still count as finished (it once looped forever).
    run(1, tmp_path, 0, "--drop-last", "--size", "100", "--batch-size", "12", expect=0)
    events = read_events(tmp_path)
    assert [e["epoch"] for e in events if e["event"] == "epoch_end"] == [0, 1, 2]
    # No partial batch: every optimizer step has the full batch. (A single replica hands
    # sampled steps out as two halves, two micro-batches of one step, to measure the noise.)
    sizes = [(e["local_bsz"], e["batch_size"]) for e in batches(events)]
    halves = 0
    for local, full in sizes:
        if local == full and not halves % 2:
            continue
        assert 2 * local == full, sizes
        halves += 1
    assert halves % 2 == 0 and halves > 0, sizes


@pytest.mark.parametrize("replicas", [1, 2])
def test_plain_loops_outside_the_epoch_loop_are_epochs_each(replicas, tmp_path):
    # Each loop over an autoscaled loader outside remaining_epochs_until lasts one epoch
    # of progress from where it began (they once yielded nothing after the first).
    result = run_json_job(JOBS / "plain_loops_job.py", replicas, tmp_path, timeout=120)[0]
    print(result)
    first, *others = result["steps"]
    assert first >= 256 // 16 - 1
    # Later loops count progress by the AdaScale gain (>= 1 per step): no more steps.
    assert all(0 < n <= first + 1 for n in others), result
    assert result["progress"] >= 4 * 256 / 16 - 1e-9
