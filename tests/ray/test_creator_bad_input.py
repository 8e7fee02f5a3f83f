"""Bad input to AdaptDLTrainableCreator and run_job: each fails at the call, before
Ray or Tune starts anything, with a message naming the argument, its value and the fix. No
test here starts Ray."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.tune")
import ray  # noqa: E402

from adaptdl_ray.job import run_job  # noqa: E402
from adaptdl_ray.tune import AdaptDLTrainableCreator  # noqa: E402
from adaptdl_ray.tune.creator import replica_spec_of  # noqa: E402


def train_fn(config):
    return None


@pytest.fixture(autouse=True)
def ray_stays_down():
    was_up = ray.is_initialized()
    yield
    assert ray.is_initialized() == was_up, "the bad input reached Ray"


# -- AdaptDLTrainableCreator(resources_per_worker=...) --------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"num_cpus_per_worker": 4, "resources_per_worker": {"CPU": 1}},
     "resources_per_worker['CPU']=1 conflicts with num_cpus_per_worker=4: give CPUs per "
     "replica with num_cpus_per_worker only"),
    ({"resources_per_worker": {"CPU": 1}}, "conflicts with num_cpus_per_worker=1.0"),
    ({"resources_per_worker": {"cpu": 2}},
     "resources_per_worker['cpu']=2 conflicts with num_cpus_per_worker=1.0: give CPUs"),
    ({"resources_per_worker": {"Gpu": 1}}, "conflicts with num_gpus_per_worker=0.0"),
    ({"num_gpus_per_worker": 1, "resources_per_worker": {"GPU": 2}},
     "resources_per_worker['GPU']=2 conflicts with num_gpus_per_worker=1"),
    ({"resources_per_worker": "GPU"},
     "resources_per_worker must be a dict of custom resource name -> amount per replica "
     "(e.g. {'TPU': 1}) or None, got 'GPU'"),
    ({"resources_per_worker": [("TPU", 1)]}, "resources_per_worker must be a dict"),
    ({"resources_per_worker": {"TPU": -1}},
     "resources_per_worker['TPU'] must be a finite number >= 0, got -1"),
    ({"resources_per_worker": {"TPU": float("nan")}}, "resources_per_worker['TPU'] must be"),
    ({"resources_per_worker": {"TPU": "1"}}, "resources_per_worker['TPU'] must be"),
    ({"resources_per_worker": {"TPU": True}}, "resources_per_worker['TPU'] must be"),
    ({"resources_per_worker": {"": 1}}, "resource names must be non-empty strings"),
    ({"resources_per_worker": {3: 1}}, "resource names must be non-empty strings, got 3"),
])
def test_creator_rejects_bad_resources_per_worker(kwargs, message):
    with pytest.raises(ValueError) as info:
        AdaptDLTrainableCreator(train_fn, **kwargs)
    assert message in str(info.value)


def test_custom_resources_are_added_to_the_cpus_and_gpus():
    trainable = AdaptDLTrainableCreator(train_fn, num_cpus_per_worker=4,
                                        resources_per_worker={"TPU": 2, "memory": 0})
    assert dict(replica_spec_of(trainable).resources) == {"CPU": 4.0, "TPU": 2.0}
    plain = AdaptDLTrainableCreator(train_fn, num_cpus_per_worker=4, resources_per_worker={})
    assert dict(replica_spec_of(plain).resources) == {"CPU": 4.0}


# -- run_job ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"config": "abc"}, "config must be a dict of the job's settings (passed to train_fn) or "
                        "None, got 'abc'"),
    ({"config": [("lr", 0.1)]}, "config must be a dict"),
    ({"config": 3}, "config must be a dict"),
    ({"name": ""}, "name must be a non-empty string or None, got ''"),
    ({"name": 5}, "name must be a non-empty string or None, got 5"),
    ({"storage_path": b"/tmp"}, "storage_path must be a non-empty string or None"),
    ({"verbose": 7}, "verbose must be Tune's verbosity, an integer in [0, 3], got 7"),
    ({"verbose": "1"}, "verbose must be"),
    ({"verbose": True}, "verbose must be"),
    ({"num_cpus_per_worker": -1}, "num_cpus_per_worker"),
    ({"min_replicas": 3, "max_replicas": 2}, "must be <= max_replicas"),
    ({"allocation_interval_s": 0}, "allocation_interval_s"),
])
def test_run_job_rejects_bad_arguments_before_starting(kwargs, message):
    with pytest.raises(ValueError) as info:
        run_job(train_fn, **kwargs)
    assert message in str(info.value)


def test_run_job_rejects_a_bad_train_fn_before_starting():
    with pytest.raises(ValueError, match="train_fn must be a function"):
        run_job("train.py")
