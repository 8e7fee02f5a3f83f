"""Ray Tune integration: data-parallel AdaptDL trials and the AdaptDL (Pollux) scheduler.

::

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator

    trainable = AdaptDLTrainableCreator(train_fn)      # train_fn(config) uses adaptdl_core.torch
    tune.run(trainable, config=space, scheduler=AdaptDLScheduler(), ...)
    model.load_state_dict(model_state_dict(result.checkpoint))   # the trained weights

The public names are imported on first use (PEP 562): a trial actor or a replica process
imports only the modules it runs, not the scheduler, its policy and their dependencies.
"""

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    "AdaptDLScheduler": "adaptdl_ray.tune.scheduler",
    "AdaptDLTrainableCreator": "adaptdl_ray.tune.creator",
    "AdaptDLTrainable": "adaptdl_ray.tune.trainable",
    "WorkerFailed": "adaptdl_ray.replicas.failures",
    "is_adaptdl_trainable": "adaptdl_ray.tune.creator",
    # (adaptdl_core's, which needs no Ray: the same function from either package)
    "model_state_dict": "adaptdl_core.torch.parallel",
    "METRIC_PREFIX": "adaptdl_ray.tune.results",
    "PROGRESS_COLUMNS": "adaptdl_ray.tune.results",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import public name ``name`` from its module on first access (then cache it here).

    Raises:
        AttributeError: ``name`` is not a public name of this package.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
