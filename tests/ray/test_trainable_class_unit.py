"""A made trainable class as Tune sees it before a trial starts (no Ray): the name it is
registered under. Tune reads a trainable's ``_name`` (or ``__name__``) as its registry key,
so the trainable's own attributes must leave that name alone."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.tune")

from ray.tune.experiment import Experiment  # noqa: E402

from adaptdl_ray.tune import AdaptDLTrainableCreator  # noqa: E402


def train_fn(config):
    return None


@pytest.mark.parametrize("name, expected", [(None, "AdaptDL_train_fn"), ("digits", "digits")])
def test_tune_registers_a_made_trainable_under_its_name(name, expected):
    cls = AdaptDLTrainableCreator(train_fn, name=name) if name else \
        AdaptDLTrainableCreator(train_fn)
    assert Experiment.get_trainable_name(cls) == expected
