"""End-to-end tests of examples/standalone_digits.py: it trains to >= 95% test accuracy,
and a 2-replica run interrupted with SIGINT resumes on 1 replica in the same epoch."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptdl_core import checkpoint
from tests.core.harness import start_replicas, wait_all

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "standalone_digits.py"
ACCURACY_RE = re.compile(r"^final test accuracy: ([0-9.]+)$", re.MULTILINE)
EPOCH_END_RE = re.compile(r"standalone_digits: epoch (\d+): train loss", re.MULTILINE)
SAVED_RE = re.compile(r"saved (\d+) states \(([0-9.]+) KiB\) to (\S+) in ([0-9.]+) s")


def final_accuracy(output: str) -> float:
    found = ACCURACY_RE.findall(output)
    assert found, f"no 'final test accuracy' line in the output:\n{output}"
    return float(found[-1])


def read_until(proc: subprocess.Popen, pattern: str, timeout: float) -> str:
    """Read ``proc``'s output until ``pattern`` appears; returns what was read.

    Reads the file descriptor directly (not the buffered text wrapper), so that
    ``communicate()`` later returns exactly the rest of the output.
    """
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while pattern.encode() not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{pattern!r} not seen within {timeout} s:\n{data.decode()}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"process ended before printing {pattern!r} "
                                     f"(status {proc.wait()}):\n{data.decode()}")
            data += chunk
    return data.decode()


def test_single_process_reaches_95_percent():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                            text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert final_accuracy(output) >= 0.95, output
    assert result.stdout.strip().splitlines()[-1].startswith("final test accuracy: "), output


@pytest.mark.slow
def test_interrupt_two_replicas_and_resume_on_one(tmp_path):
    ckpt = tmp_path / "ckpt"
    # 20 epochs of ~22 batches leave the job well over a second of training after the
    # signal, which it handles within two batches.
    args = ["--epochs", "20", "--log-every", "10"]
    procs = start_replicas(EXAMPLE, 2, ckpt, restart=0, args=args)
    try:
        # SIGINT to replica 0 in the middle of epoch 1 (after its 10th batch).
        head = read_until(procs[0], "epoch 1 step 10/", timeout=120)
        procs[0].send_signal(signal.SIGINT)
    finally:
        results = wait_all(procs, timeout=120)
    out0 = head + results[0][1]
    for rank, (status, output) in enumerate(results):
        assert status == 143, f"rank {rank} exited with {status}:\n{output}"
    assert "final test accuracy" not in out0, "the job finished before the signal landed"

    # Replica 0 wrote a complete checkpoint of the interrupted epoch.
    saved = SAVED_RE.search(out0)
    assert saved, out0
    ckpt_dir = checkpoint.latest_checkpoint_dir(str(ckpt))
    assert ckpt_dir is not None and os.path.samefile(ckpt_dir, saved.group(3))
    assert os.path.isfile(os.path.join(ckpt_dir, "MANIFEST.json"))
    with open(os.path.join(ckpt_dir, "adaptdl-epoch")) as f:
        epoch = json.load(f)["finished_epochs"]
    finished = [int(e) for e in EPOCH_END_RE.findall(out0)]
    assert finished == list(range(epoch)) and epoch >= 1, out0

    # Restart on one replica: it continues that epoch and finishes the job.
    [(status, out1)] = wait_all(start_replicas(EXAMPLE, 1, ckpt, restart=1, args=args),
                                timeout=180)
    assert status == 0, out1
    assert f"resuming at epoch {epoch} on 1 replica(s) (restart 1)" in out1, out1
    assert [int(e) for e in EPOCH_END_RE.findall(out1)] == list(range(epoch, 20)), out1
    assert final_accuracy(out1) >= 0.95, out1
