"""Damaged checkpoints of a real 2-replica job run through ``python -m adaptdl_core.launch``,
as a user meets them.

The job (``jobs/elastic_job.py``: a linear model, SGD with momentum, a shuffled loader, 3
epochs) takes an in-place checkpoint in epoch 1 (``checkpoint-0``) and is interrupted with
SIGINT to its whole process group, as Ctrl-C would, in epoch 2 (``checkpoint-1``, status
143): both replicas hold at a batch of epoch 2 until the signal has landed. Each case
copies that checkpoint tree, damages it one way, and runs the same command again with
``--restarts 1``. It must either finish with final weights bitwise equal to an
uninterrupted 2-replica run's (falling back to ``checkpoint-0`` with a warning naming the
damaged file, or ignoring junk beside an intact ``checkpoint-1``), or exit non-zero with a
message naming the damaged files. One reference run and one interrupted run serve every
case.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib

import pytest
import torch

from tests.core.harness import JOBS

# One reference run and one interrupted run, then a resumed run per case: about 45 s.
pytestmark = pytest.mark.slow

JOB = JOBS / "elastic_job.py"
SIZE = 192
# 2 replicas, global batch 8: 24 batches per epoch; the 30th is in epoch 1, the 50th in
# epoch 2. The replicas agree on a request in the side values they exchange every ~0.2 s of
# steps (adaptdl_core.torch._gradient_probe), so a request lands a few batches later, and
# one agreed after an epoch's last batch lands at the next epoch's start. Batches of at
# least 0.05 s keep that to about four batches however fast the machine (with steps of a few
# milliseconds it was twenty: past the end of the epoch), and both requests leave 18 or
# more batches of their epoch to land in.
JOB_ARGS = ["--size", str(SIZE), "--batch-size", "8", "--save-after", "30", "--sleep", "0.05"]
HOLD_AFTER = 50
MODEL, LOADER = "adaptdl-dataparallel", "adaptdl-dataloader-0"


def _launch(ckpt, record, *extra, restarts=0, session=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ADAPTDL_TIMEOUT="60")
    record.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "adaptdl_core.launch", "--replicas", "2", "--restarts",
         str(restarts), "--checkpoint-path", str(ckpt), str(JOB), "--record", str(record),
         *JOB_ARGS, *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=session)


def _held(record):
    return all((record / f"held-r0-rank{rank}").exists() for rank in (0, 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run's final weights and the interrupted run's checkpoint tree."""
    root = tmp_path_factory.mktemp("launch_damage")
    reference = _launch(root / "ref" / "ckpt", root / "ref")
    broken = _launch(root / "broken" / "ckpt", root / "broken", "--hold-after",
                     str(HOLD_AFTER), session=True)
    deadline = time.monotonic() + 120
    while not _held(root / "broken") and broken.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _held(root / "broken"), broken.communicate(timeout=120)[0][-4000:]
    os.killpg(broken.pid, signal.SIGINT)
    out, _ = broken.communicate(timeout=120)
    assert broken.returncode == 143, out[-4000:]
    ref_out, _ = reference.communicate(timeout=120)
    assert reference.returncode == 0, ref_out[-4000:]
    ckpt = root / "broken" / "ckpt"
    assert sorted(os.listdir(ckpt)) == ["checkpoint-0", "checkpoint-1"]
    final = torch.load(root / "ref" / "final.pt", weights_only=True)
    return root, ckpt, final


def _resign(ckpt, name):
    data = (ckpt / name).read_bytes()
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    manifest["files"][name] = {"size": len(data), "crc32": zlib.crc32(data)}
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))


def _position_past_the_end(ckpt):
    state = json.loads((ckpt / LOADER).read_text())
    state["current_index"] = 10 * SIZE
    (ckpt / LOADER).write_text(json.dumps(state))
    _resign(ckpt, LOADER)


def _newer_junk(root):
    # An empty newer checkpoint directory, and what a write killed (SIGKILL) midway
    # leaves: a .tmp- directory with a partial copy (simulated; the write renames it into
    # place only once complete).
    (root / "checkpoint-99").mkdir()
    partial = root / ".tmp-killed"
    shutil.copytree(root / "checkpoint-1", partial)
    (partial / "MANIFEST.json").unlink()
    data = (partial / MODEL).read_bytes()
    (partial / MODEL).write_bytes(data[:len(data) // 2])


# case -> (damage(checkpoint root), expected outcome, files the output must name)
CASES = {
    "model-deleted": (lambda r: (r / "checkpoint-1" / MODEL).unlink(), "checkpoint-0",
                      ["checkpoint-1/" + MODEL]),
    "loader-deleted": (lambda r: (r / "checkpoint-1" / LOADER).unlink(), "checkpoint-0",
                       ["checkpoint-1/" + LOADER]),
    "manifest-deleted": (lambda r: (r / "checkpoint-1" / "MANIFEST.json").unlink(),
                         "checkpoint-0", ["checkpoint-1/MANIFEST.json"]),
    "position-past-the-end": (lambda r: _position_past_the_end(r / "checkpoint-1"),
                              "checkpoint-0", ["checkpoint-1/" + LOADER]),
    "newer-junk": (_newer_junk, "checkpoint-1", []),
    "all-damaged": (lambda r: ((r / "checkpoint-1" / MODEL).write_bytes(b"x"),
                               (r / "checkpoint-0" / LOADER).unlink()), "error",
                    ["checkpoint-1/" + MODEL, "checkpoint-0/" + LOADER]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_checkpoint_resumes_bitwise_or_fails_naming_the_file(runs, case):
    root, interrupted, final = runs
    damage, outcome, named = CASES[case]
    ckpt = root / case / "ckpt"
    shutil.copytree(interrupted, ckpt)
    damage(ckpt)
    proc = _launch(ckpt, root / case, restarts=1)
    out, _ = proc.communicate(timeout=180)
    for name in named:
        assert str(ckpt / name) in out, f"{case}: the output does not name {name}:\n{out[-4000:]}"
    if outcome == "error":
        assert proc.returncode not in (0, 143), out[-4000:]
        assert "no intact checkpoint" in out
        return
    assert proc.returncode == 0, out[-4000:]
    assert f"restoring states from {ckpt / outcome}" in out, out[-4000:]
    weights = torch.load(root / case / "final.pt", weights_only=True)
    assert weights.keys() == final.keys()
    for key in final:
        assert torch.equal(weights[key], final[key]), f"{case}: {key} differs"
