"""Checkpoint-restart across real processes: exactly-once data, bitwise resume, failures.

Each test runs ``jobs/elastic_job.py`` as K gloo replicas, interrupts it, restarts it
(possibly with another K) from the checkpoint, and checks what the job recorded.
"""

import math
import signal
import time

import pytest
import torch

from tests.core.harness import JOBS, read_events, run_replicas, start_replicas, wait_all
from tests.exactly_once import assert_exactly_once

JOB = JOBS / "elastic_job.py"
SIZE = 96


def run(replicas, tmp_path, restart, *extra, expect=None, timeout=120, env=None):
    results = run_replicas(JOB, replicas, tmp_path / "ckpt", restart,
                           ["--record", str(tmp_path), "--size", str(SIZE), *extra],
                           extra_env=env, timeout=timeout)
    if expect is not None:
        for rank, (status, out) in enumerate(results):
            assert status == expect, f"rank {rank} exited {status}, expected {expect}:\n{out[-4000:]}"
    return results


@pytest.mark.slow
def test_exactly_once_across_1_2_1_replicas(tmp_path):
    # Interruptions at arbitrary batches: mid-epoch 0, mid-epoch 1 (different K each time).
    run(1, tmp_path, 0, "--stop-after", "5", expect=143)
    run(2, tmp_path, 1, "--stop-after", "9", "--stop-rank", "1", expect=143)
    run(1, tmp_path, 2, expect=0)
    events = read_events(tmp_path)
    assert_exactly_once(events, SIZE, epochs=3)
    starts = sorted((e["restart"], e["replicas"], e["epoch"]) for e in events
                    if e["event"] == "start" and e["rank"] == 0)
    # Batch size 8: 12 batches per epoch with 1 replica. Stop after 5 -> still epoch 0;
    # 2 replicas (global batch 8) then run 9 more: 7 to finish epoch 0, 2 into epoch 1.
    assert starts[:2] == [(0, 1, 0), (1, 2, 0)]
    # The replicas agree on rank 1's stop with the side values of a later step (every
    # few steps): within epoch 1's training, or at its loop's last boundary, where it waits
    # for epoch 2 (a resumption never lands after an epoch's training loop).
    assert starts[2] in [(2, 1, 1), (2, 1, 2)], starts
    if starts[2][2] == 1:
        assert any(e["event"] == "batch" and e["restart"] == 2 and e["epoch"] == 1
                   for e in events), "resumed in epoch 1 with its training spent"


def test_resume_continues_at_same_position_and_epoch(tmp_path):
    run(2, tmp_path, 0, "--stop-after", "4", expect=143)
    run(1, tmp_path, 1, "--stop-after", "1", expect=143)
    events = read_events(tmp_path)
    first = [e for e in events if e["event"] == "batch" and e["restart"] == 0 and e["rank"] == 0]
    second = [e for e in events if e["event"] == "batch" and e["restart"] == 1]
    # The 2-replica run consumed 4 global batches of 8; the 1-replica run starts at 32.
    assert first[-1]["index"] == 32 and second[0]["epoch"] == 0
    assert second[0]["index"] == 40 and second[0]["local_bsz"] == 8
    assert first[0]["local_bsz"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_interrupted_run_matches_uninterrupted_bitwise(tmp_path, replicas):
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    straight.mkdir(), broken.mkdir()
    run(replicas, straight, 0, expect=0)
    run(replicas, broken, 0, "--stop-after", "7", expect=143)
    run(replicas, broken, 1, "--stop-after", "11", expect=143)
    run(replicas, broken, 2, expect=0)
    a = torch.load(straight / "final.pt", weights_only=True)
    b = torch.load(broken / "final.pt", weights_only=True)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after interrupted training"
    # The epoch metrics agree as well (sums may associate differently: compare closely).
    ends = lambda d: {e["epoch"]: e["results"] for e in read_events(d)  # noqa: E731
                      if e["event"] == "epoch_end" and e["rank"] == 0}
    want, got = ends(straight), ends(broken)
    assert sorted(want) == sorted(got) == [0, 1, 2]
    for epoch in want:
        assert got[epoch]["train_n"] == want[epoch]["train_n"] == SIZE
        assert got[epoch]["valid_n"] == want[epoch]["valid_n"] == SIZE
        for key in ("train_loss", "valid_sq"):
            assert math.isclose(got[epoch][key], want[epoch][key], rel_tol=1e-9)


@pytest.mark.slow
def test_three_replicas_resume_from_two(tmp_path):
    # 100 samples: 3 replicas do not divide an epoch, so a 3-replica launch pads it (2
    # repeats, allowed by the padding rule; nothing else is). Epoch 0 on 2 replicas (the
    # job then ends there), epoch 1 and part of 2 on 3, the rest on 2 again.
    size = 100
    run(2, tmp_path, 0, "--size", str(size), "--epochs", "1", expect=0)
    run(3, tmp_path, 1, "--size", str(size), "--epochs", "3", "--stop-after", "14",
        "--stop-rank", "2", "--sleep", "0.02")
    run(2, tmp_path, 2, "--size", str(size), "--epochs", "3", expect=0)
    events = read_events(tmp_path)
    assert_exactly_once(events, size, epochs=3)
    launch = [e for e in events if e["event"] == "batch" and e["restart"] == 1]
    assert sum(len(e["idx"]) for e in launch if e["epoch"] == 1) == 102


def test_sigint_on_running_job_then_resume_with_fewer_replicas(tmp_path):
    # Rank 0 holds after its 3rd batch until the signal has landed; rank 1 learns of the
    # stop through the replicas' agreement.
    procs = start_replicas(JOB, 2, tmp_path / "ckpt", 0,
                           ["--record", str(tmp_path), "--size", str(SIZE),
                            "--hold-after", "3", "--hold-rank", "0", "--sleep", "0.05"])
    held = tmp_path / "held-r0-rank0"
    deadline = time.monotonic() + 60
    while not held.exists() and procs[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert held.exists(), "rank 0 did not reach its third batch"
    procs[0].send_signal(signal.SIGINT)
    results = wait_all(procs, timeout=60)
    assert [s for s, _ in results] == [143, 143], results[0][1][-3000:]
    assert any(p.name.startswith("checkpoint-") for p in (tmp_path / "ckpt").iterdir())
    run(1, tmp_path, 1, expect=0)
    events = read_events(tmp_path)
    before = [e for e in events if e["event"] == "batch" and e["restart"] == 0 and e["rank"] == 0]
    after = [e for e in events if e["event"] == "batch" and e["restart"] == 1]
    # The resumed run starts exactly where the interrupted one stopped: the next global
    # batch of 8 in the same epoch, or the next epoch's first if the stop came after the
    # last batch of an epoch. (A batch's "index" is the epoch's position before it; the
    # third batch, where rank 0 held, starts at 16.)
    last = (before[-1]["epoch"], before[-1]["index"])
    assert last >= (0, 16)
    following = (last[0], last[1] + 8) if last[1] + 8 < SIZE else (last[0] + 1, 0)
    assert (after[0]["epoch"], after[0]["index"]) == following, (last, after[0])
    assert_exactly_once(events, SIZE, epochs=3)


def test_dead_replica_fails_the_others_within_timeout(tmp_path):
    start = time.time()
    results = run(2, tmp_path, 0, "--die-after", "3", "--die-rank", "1",
                  env={"ADAPTDL_TIMEOUT": "5"}, timeout=90)
    elapsed = time.time() - start
    (status0, out0), (status1, _) = results
    assert status1 == 7
    assert status0 not in (0, 143), "surviving replica should fail, not finish or checkpoint"
    assert elapsed < 60, f"took {elapsed:.0f} s: the survivor waited too long"
    assert "Error" in out0 or "error" in out0
