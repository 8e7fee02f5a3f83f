"""A damaged checkpoint never resumes silently wrong.

A real one-replica training job (in-process, a torch gloo group of one) takes two
in-place checkpoints, ``checkpoint-0`` in epoch 0 and ``checkpoint-1`` in epoch 1, and runs
to the end: that run is the reference. Then the checkpoints are damaged in one way each
(a state file deleted, truncated, overwritten with garbage, the manifest deleted or
replaced by an older one, an empty newer checkpoint directory, every checkpoint damaged)
and the job is restarted and run to the end again. Each case must either fall back to
the newest intact checkpoint, which shows as exactly the reference's batches after that
checkpoint and final weights bitwise equal to the reference's, with a warning naming the
damaged file; or raise :class:`~adaptdl_core.checkpoint.CheckpointError` naming it.
"""

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint

SIZE, BATCH = 40, 4  # 10 batches per epoch
EPOCHS = 2
# Where the reference run asks for its checkpoints: (epoch, batch index); each is taken
# at the boundary after that batch.
REQUESTS = [(0, 3), (1, 5)]
# How many of the reference's batches precede each checkpoint.
RESUME_AT = {"checkpoint-0": 4, "checkpoint-1": 10 + 6}
MODEL = "adaptdl-dataparallel"
LOADER = "adaptdl-dataloader-0"
EPOCH = "adaptdl-epoch"


def _job():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    ddp = adl.AdaptiveDataParallel(model, opt, lr_scheduler=sched)
    data = TensorDataset(torch.arange(SIZE, dtype=torch.float32).unsqueeze(1))
    loader = adl.AdaptiveDataLoader(data, batch_size=BATCH, shuffle=True)
    return ddp, opt, sched, loader


def _train(requests=()):
    """Run the job to the end; returns (batches seen, final weights)."""
    ddp, opt, sched, loader = _job()
    seen = []
    # (No end-of-training checkpoint: these tests fall back among the in-place ones.)
    for epoch in adl.remaining_epochs_until(EPOCHS, final_checkpoint=False):
        for i, (x,) in enumerate(loader):
            opt.zero_grad()
            ddp(x).pow(2).mean().backward()
            opt.step()
            sched.step()
            seen.append((epoch, x.squeeze(1).int().tolist()))
            if (epoch, i) in requests:
                adl.request_checkpoint()
    return seen, [p.detach().clone() for p in ddp.module.parameters()]


@pytest.fixture
def reference(process_group, ckpt_dir, restart):
    """The uninterrupted run, which leaves checkpoint-0 and checkpoint-1 behind."""
    seen, final = _train(REQUESTS)
    assert sorted(os.listdir(ckpt_dir)) == ["checkpoint-0", "checkpoint-1"]
    restart()
    return seen, final


def _resume_and_check(reference, expect):
    seen, final = reference
    resumed, weights = _train()
    assert resumed == seen[RESUME_AT[expect]:], f"did not resume from {expect}"
    for a, b in zip(final, weights, strict=True):
        assert torch.equal(a, b)


def _rewrite_manifest(ckpt, edit):
    path = ckpt / "MANIFEST.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _delete(path):
    path.unlink()


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _garbage(path):
    # Same size, so only the checksum can tell.
    path.write_bytes(bytes((i * 131 + 7) % 256 for i in range(path.stat().st_size)))


def _flip_one_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "model-deleted": (MODEL, _delete, "is missing"),
    "model-truncated": (MODEL, _truncate, "bytes but the manifest says"),
    "model-garbage": (MODEL, _garbage, "CRC-32"),
    "model-one-bit": (MODEL, _flip_one_byte, "CRC-32"),
    "loader-deleted": (LOADER, _delete, "is missing"),
    "loader-garbage": (LOADER, _garbage, "CRC-32"),
    "epoch-deleted": (EPOCH, _delete, "is missing"),
    "manifest-deleted": ("MANIFEST.json", _delete, "is missing"),
    "manifest-garbage": ("MANIFEST.json", _garbage, "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(reference, ckpt_dir,
                                                                    caplog, case):
    name, damage, why = DAMAGE[case]
    damaged = ckpt_dir / "checkpoint-1" / name
    damage(damaged)
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.checkpoint"):
        _resume_and_check(reference, "checkpoint-0")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(damaged) in w and why in w for w in warnings), warnings


def test_a_stale_manifest_is_damage(reference, ckpt_dir, caplog):
    # checkpoint-1 with checkpoint-0's manifest: the names match, the files do not.
    old = (ckpt_dir / "checkpoint-0" / "MANIFEST.json").read_bytes()
    (ckpt_dir / "checkpoint-1" / "MANIFEST.json").write_bytes(old)
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.checkpoint"):
        _resume_and_check(reference, "checkpoint-0")
    assert any("checkpoint-1" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)


def test_an_empty_newer_checkpoint_is_skipped(reference, ckpt_dir):
    (ckpt_dir / "checkpoint-99").mkdir()
    _resume_and_check(reference, "checkpoint-1")
    assert checkpoint.latest_checkpoint_dir() == str(ckpt_dir / "checkpoint-1")


def test_a_manifest_that_drops_a_state_is_damage_not_a_fresh_state(reference, ckpt_dir):
    # A manifest listing fewer states than were saved is not intact: every state a
    # checkpoint lists needs its size and checksum, and the sizes/checksums must cover
    # exactly the listed states.
    def drop(manifest):
        manifest["states"].remove(MODEL)
    _rewrite_manifest(ckpt_dir / "checkpoint-1", drop)
    _resume_and_check(reference, "checkpoint-0")


def test_when_every_checkpoint_is_damaged_the_error_names_the_files(reference, ckpt_dir):
    _truncate(ckpt_dir / "checkpoint-1" / MODEL)
    _delete(ckpt_dir / "checkpoint-0" / LOADER)
    with pytest.raises(checkpoint.CheckpointError) as info:
        _job()
    message = str(info.value)
    assert str(ckpt_dir / "checkpoint-1" / MODEL) in message
    assert str(ckpt_dir / "checkpoint-0" / LOADER) in message
    assert "no intact checkpoint" in message


def test_checkpoints_from_before_checksums_still_restore(reference, ckpt_dir):
    # A manifest without "files" (written before this change) is accepted unverified.
    for ckpt in ("checkpoint-0", "checkpoint-1"):
        _rewrite_manifest(ckpt_dir / ckpt, lambda manifest: manifest.pop("files"))
    _resume_and_check(reference, "checkpoint-1")


def test_an_unverified_damaged_file_fails_naming_it_without_torch_advice(reference, ckpt_dir):
    _rewrite_manifest(ckpt_dir / "checkpoint-1", lambda manifest: manifest.pop("files"))
    damaged = ckpt_dir / "checkpoint-1" / MODEL
    _garbage(damaged)
    with pytest.raises(checkpoint.CheckpointError) as info:
        _job()
    assert str(damaged) in str(info.value)
    assert "weights_only" not in str(info.value)


def test_damage_after_verification_is_caught_when_the_file_loads(reference, ckpt_dir,
                                                                  monkeypatch):
    # The file changes between the restore's verification and its load: the bytes
    # loaded are checked again.
    damaged = ckpt_dir / "checkpoint-1" / MODEL
    verify = checkpoint.verify_checkpoint

    def verify_then_damage(path):
        manifest = verify(path)
        if Path(path).name == "checkpoint-1" and damaged.exists():
            _flip_one_byte(damaged)
        return manifest

    monkeypatch.setattr(checkpoint, "verify_checkpoint", verify_then_damage)
    with pytest.raises(checkpoint.CheckpointError, match="CRC-32") as info:
        _job()
    assert str(damaged) in str(info.value)


def test_the_manifest_lists_size_and_crc32_of_every_state(reference, ckpt_dir):
    import zlib
    ckpt = ckpt_dir / "checkpoint-1"
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == set(manifest["states"]) == \
        set(os.listdir(ckpt)) - {"MANIFEST.json"}
    for name, entry in manifest["files"].items():
        data = (ckpt / name).read_bytes()
        assert entry == {"size": len(data), "crc32": zlib.crc32(data)}


class Value(checkpoint.State):
    """A State holding one JSON value."""

    def __init__(self, name, value=None):
        super().__init__(name)
        self.value = value

    def save(self, fileobj):
        checkpoint.dump_json(self.value, fileobj)

    def load(self, fileobj):
        self.value = checkpoint.load_json(fileobj)


def test_the_next_save_keeps_the_intact_fallback_and_drops_the_damaged(ckpt_dir, restart):
    s = Value("s", "v0")
    checkpoint.save_all_states()
    s.value = "v1"
    checkpoint.save_all_states()
    _garbage(ckpt_dir / "checkpoint-1" / "s")
    restart()
    s = Value("s")
    assert checkpoint.load_state(s) and s.value == "v0"
    s.value = "v2"
    assert checkpoint.save_all_states() == str(ckpt_dir / "checkpoint-2")
    # The restore point stays as the fallback; the damaged checkpoint goes.
    assert sorted(os.listdir(ckpt_dir)) == ["checkpoint-0", "checkpoint-2"]
    restart()
    s = Value("s")
    assert checkpoint.load_state(s) and s.value == "v2"


def test_verify_checkpoint_reports_a_vanished_directory_as_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        checkpoint.verify_checkpoint(str(tmp_path / "checkpoint-3"))


def _set_loader_position(ckpt, index):
    """Rewrite the loader's saved position and re-sign the manifest, as a bug or a hand
    edit would (the checksums then match: only the value can tell)."""
    import zlib
    state = json.loads((ckpt / LOADER).read_text())
    state["current_index"] = index
    data = json.dumps(state).encode()
    (ckpt / LOADER).write_bytes(data)

    def resign(manifest):
        manifest["files"][LOADER] = {"size": len(data), "crc32": zlib.crc32(data)}
    _rewrite_manifest(ckpt, resign)


def test_a_loader_position_past_the_epoch_end_is_damage(reference, ckpt_dir, caplog):
    # Restored there, the rest of the epoch would be silently skipped.
    _set_loader_position(ckpt_dir / "checkpoint-1", 10 * SIZE)
    with caplog.at_level(logging.WARNING, logger="adaptdl_core.checkpoint"):
        _resume_and_check(reference, "checkpoint-0")
    damaged = str(ckpt_dir / "checkpoint-1" / LOADER)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(damaged in w and f"current_index={10 * SIZE} is past the end of the epoch"
               in w for w in warnings), warnings


def test_a_negative_loader_position_is_damage(reference, ckpt_dir):
    _set_loader_position(ckpt_dir / "checkpoint-1", -1)
    _resume_and_check(reference, "checkpoint-0")


def test_impossible_positions_everywhere_fail_naming_the_files(reference, ckpt_dir):
    for ckpt in ("checkpoint-0", "checkpoint-1"):
        _set_loader_position(ckpt_dir / ckpt, SIZE + 1)
    with pytest.raises(checkpoint.CheckpointError) as info:
        _job()
    for ckpt in ("checkpoint-0", "checkpoint-1"):
        assert str(ckpt_dir / ckpt / LOADER) in str(info.value)
    assert f"current_index={SIZE + 1}" in str(info.value)


def test_the_last_position_of_an_epoch_is_no_damage(reference, ckpt_dir):
    # A loop checkpointed at its very end (position == dataset length) is legitimate.
    state = json.loads((ckpt_dir / "checkpoint-1" / LOADER).read_text())
    assert state["limits"] == {"dataset_len": SIZE, "batch_size": BATCH, "max_batch_size": None}
    _set_loader_position(ckpt_dir / "checkpoint-1", SIZE)
    assert checkpoint.latest_checkpoint_dir() == str(ckpt_dir / "checkpoint-1")
