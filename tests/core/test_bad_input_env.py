"""Bad ``ADAPTDL_CHECKPOINT_PATH``: set but empty is refused, an unwritable
path is found when the process group starts, not at the first checkpoint after the
training it was to save; a stop without a checkpoint path says it saved nothing.
"""

import logging
import os
import signal

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint, context, env


@pytest.mark.parametrize("blank", ["", " ", "\t"])
def test_a_set_but_empty_checkpoint_path_is_refused(monkeypatch, blank):
    # Once: a stop request then exited 143 ("checkpointed") having saved nothing.
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", blank)
    with pytest.raises(ValueError) as info:
        env.checkpoint_path()
    text = str(info.value)
    assert f"ADAPTDL_CHECKPOINT_PATH={blank!r}" in text and "set but empty" in text
    assert "unset it" in text
    with pytest.raises(ValueError, match="ADAPTDL_CHECKPOINT_PATH"):
        adl.AdaptiveDataLoader(TensorDataset(torch.zeros(4)), batch_size=2)


def test_an_unset_checkpoint_path_means_no_checkpoints():
    assert env.checkpoint_path() is None


def unwritable(tmp_path):
    """A path that no one, root included, can create: below a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return str(blocker / "ckpt")


def test_check_checkpoint_root_names_the_path_and_the_reason(tmp_path):
    path = unwritable(tmp_path)
    with pytest.raises(ValueError) as info:
        checkpoint.check_checkpoint_root(path)
    text = str(info.value)
    assert f"ADAPTDL_CHECKPOINT_PATH={path!r} cannot hold checkpoints" in text
    assert "Not a directory" in text and "writable directory" in text


def test_check_checkpoint_root_creates_the_directory_and_leaves_nothing(tmp_path):
    root = tmp_path / "new" / "ckpt"
    checkpoint.check_checkpoint_root(root)
    assert root.is_dir() and os.listdir(root) == []
    checkpoint.check_checkpoint_root(None)  # no checkpoints: nothing to check


@pytest.mark.parametrize("value", ["unwritable", "empty"])
def test_init_process_group_refuses_a_bad_checkpoint_path(no_process_group, monkeypatch,
                                                          tmp_path, value):
    path = unwritable(tmp_path) if value == "unwritable" else ""
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", path)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError, match="ADAPTDL_CHECKPOINT_PATH="):
        adl.init_process_group("gloo")
    # Refused before anything started.
    assert not dist.is_initialized()
    assert [k for k in os.environ if k.startswith("ADAPTDL_")] == ["ADAPTDL_CHECKPOINT_PATH"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


@pytest.mark.parametrize("make", ["loader", "accumulator"])
def test_an_unwritable_path_is_refused_at_the_first_state_without_init(monkeypatch, tmp_path,
                                                                     make):
    # Without init_process_group (a loader-only script, or torch's own process group) the
    # path was found only at the first save, after the training: a bare NotADirectoryError.
    path = unwritable(tmp_path)
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", path)
    with pytest.raises(ValueError) as info:
        if make == "loader":
            adl.AdaptiveDataLoader(TensorDataset(torch.zeros(4)), batch_size=2)
        else:
            adl.Accumulator()
    assert f"ADAPTDL_CHECKPOINT_PATH={path!r} cannot hold checkpoints" in str(info.value)


def test_only_replica_0_probes_the_checkpoint_path(monkeypatch, tmp_path):
    # (Only replica 0 writes checkpoints; the others only read them.)
    root = tmp_path / "ckpt"
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(root))
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "2")
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "1")
    adl.Accumulator()
    assert not root.exists()
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "0")
    context.reset()
    adl.Accumulator()
    assert root.is_dir() and os.listdir(root) == []


def test_a_stop_without_checkpoint_path_says_it_saved_nothing(caplog):
    loader = adl.AdaptiveDataLoader(TensorDataset(torch.zeros(8)), batch_size=2)
    adl.request_checkpoint_and_exit()
    with caplog.at_level(logging.INFO, logger="adaptdl_core.torch"):
        with pytest.raises(adl.CheckpointExit) as info:
            for _ in loader:
                pass
    assert info.value.code == 143 and info.value.checkpoint_dir is None
    assert "stopping without a checkpoint (no ADAPTDL_CHECKPOINT_PATH is set)" in caplog.text
    assert "checkpointed" not in caplog.text
