"""Ray Tune integration: data-parallel AdaptDL trials and the AdaptDL (Pollux) scheduler.

::

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator

    trainable = AdaptDLTrainableCreator(train_fn)      # train_fn(config) uses adaptdl_core.torch
    tune.run(trainable, config=space, scheduler=AdaptDLScheduler(), ...)
"""

from adaptdl_ray.tune.resources import ReplicaSpec
from adaptdl_ray.tune.scheduler import AdaptDLScheduler
from adaptdl_ray.tune.scheduler_state import SchedulerState, TrialRecord
from adaptdl_ray.tune.trainable import (AdaptDLTrainable, AdaptDLTrainableCreator,
                                        is_adaptdl_trainable)
from adaptdl_ray.tune.worker import METRIC_PREFIX

__all__ = ["AdaptDLScheduler", "AdaptDLTrainableCreator", "AdaptDLTrainable",
           "ReplicaSpec", "SchedulerState", "TrialRecord", "is_adaptdl_trainable",
           "METRIC_PREFIX"]
