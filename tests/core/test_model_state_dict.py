"""One call loads the weights out of any AdaptDL checkpoint a user has, without Ray: a
standalone job's checkpoint path, one checkpoint folder (as ``adaptdl-ray cp`` copies it),
a command-line job's storage directory, a Tune trial's checkpoint folder, or an object
with ``as_directory()`` (a ``ray.tune.Checkpoint``)."""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch

from adaptdl_core import checkpoint
from adaptdl_core.torch import model_state_dict

WEIGHTS = {"w": torch.arange(3.0)}


class _ModelState(checkpoint.State):
    """What AdaptiveDataParallel saves, reduced to its model weights."""

    def __init__(self, weights, name="adaptdl-dataparallel"):
        super().__init__(name)
        self.weights = weights

    def save(self, fileobj):
        torch.save({"model": self.weights, "optimizer": {}}, fileobj)

    def load(self, fileobj):
        pass


@pytest.fixture
def saved(ckpt_dir):
    """A checkpoint path holding two checkpoints; the newest has WEIGHTS."""
    state = _ModelState({"w": torch.zeros(3)})
    checkpoint.save_all_states()
    state.weights = WEIGHTS
    checkpoint.save_all_states()
    return ckpt_dir


def _equal(found):
    return torch.equal(found["w"], WEIGHTS["w"])


def test_a_checkpoint_path_and_one_checkpoint_folder(saved, tmp_path):
    assert _equal(model_state_dict(saved))
    newest = checkpoint.latest_checkpoint_dir(saved)
    copied = shutil.copytree(newest, tmp_path / "copied")  # what `adaptdl-ray cp` gives
    assert _equal(model_state_dict(copied))
    assert checkpoint.find_checkpoint(copied) == str(copied)


@pytest.mark.parametrize("embedded", checkpoint.EMBEDDED_ROOTS)
def test_a_folder_that_holds_a_checkpoint_path(saved, tmp_path, embedded):
    outer = tmp_path / "outer"
    shutil.copytree(saved, outer / embedded)
    (outer / "model.pt").write_bytes(b"the user's own file")
    assert _equal(model_state_dict(str(outer)))


def test_an_object_with_as_directory(saved):
    class Checkpoint:  # the shape of ray.tune.Checkpoint
        @contextlib.contextmanager
        def as_directory(self):
            yield str(saved)

    assert _equal(model_state_dict(Checkpoint()))


def test_what_is_not_a_checkpoint_says_where_it_looked(saved, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no AdaptDL checkpoint.*checkpoint-<n>"):
        model_state_dict(empty)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        model_state_dict(tmp_path / "missing")
    with pytest.raises(ValueError, match="no AdaptiveDataParallel state named 'other'"):
        model_state_dict(saved, name="other")
    with pytest.raises(ValueError, match="no checkpoint was given"):
        model_state_dict(None)
    with pytest.raises(TypeError, match="pass a directory path"):
        checkpoint.find_checkpoint(3)
