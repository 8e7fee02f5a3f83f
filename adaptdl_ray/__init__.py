"""adaptdl_ray: Ray adapters for adaptdl_core.

* :mod:`adaptdl_ray.tune`: data-parallel AdaptDL trials (``AdaptDLTrainableCreator``) and
  the Pollux scheduler for Ray Tune (``AdaptDLScheduler``);
* :func:`adaptdl_ray.run_job`: one elastic job alone on a Ray cluster.
"""

from adaptdl_ray.job import run_job

__all__ = ["run_job"]
