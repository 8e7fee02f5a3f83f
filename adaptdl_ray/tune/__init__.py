"""Ray Tune integration: data-parallel AdaptDL trials and the AdaptDL (Pollux) scheduler.

::

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator

    trainable = AdaptDLTrainableCreator(train_fn)      # train_fn(config) uses adaptdl_core.torch
    tune.run(trainable, config=space, scheduler=AdaptDLScheduler(), ...)
    model.load_state_dict(model_state_dict(result.checkpoint))   # the trained weights
"""

from adaptdl_ray.tune.checkpoint_files import model_state_dict
from adaptdl_ray.tune.resources import ReplicaSpec
from adaptdl_ray.tune.results import METRIC_PREFIX
from adaptdl_ray.tune.scheduler import AdaptDLScheduler
from adaptdl_ray.tune.scheduler_state import SchedulerState, TrialRecord
from adaptdl_ray.tune.trainable import (AdaptDLTrainable, AdaptDLTrainableCreator,
                                        WorkerFailed, is_adaptdl_trainable)

__all__ = ["AdaptDLScheduler", "AdaptDLTrainableCreator", "AdaptDLTrainable",
           "ReplicaSpec", "SchedulerState", "TrialRecord", "WorkerFailed",
           "is_adaptdl_trainable", "model_state_dict", "METRIC_PREFIX"]
