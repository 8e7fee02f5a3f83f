"""adaptdl_ray: Ray adapters for adaptdl_core.

* :mod:`adaptdl_ray.tune`: data-parallel AdaptDL trials (``AdaptDLTrainableCreator``) and
  the Pollux scheduler for Ray Tune (``AdaptDLScheduler``);
* :func:`adaptdl_ray.run_job`: one elastic job alone on a Ray cluster.

Names are imported on first use (PEP 562), so a process that only needs one submodule
(a trial actor, a replica process) does not pay for the scheduler and its policy.
"""

from typing import Any

__all__ = ["run_job"]


def __getattr__(name: str) -> Any:
    """Import :func:`run_job` on first access; any other name is an AttributeError."""
    if name == "run_job":
        from adaptdl_ray.job import run_job
        return run_job
    raise AttributeError(f"module 'adaptdl_ray' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
