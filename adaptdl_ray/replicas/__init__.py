"""The replica layer: what every front-end runs an elastic job on.

* :mod:`.worker`: the replica actor (one process of the job, running the training
  function with the ``ADAPTDL_*`` variables of its rank);
* :mod:`.group`: a launch's replicas as one group (ranks, rendezvous, start, stop at a
  batch boundary, in-place checkpoints, failures);
* :mod:`.in_process`: the one replica of a one-replica launch, run in its caller's process;
* :mod:`.pool`: replicas that each hold a one-bundle placement group of their own, reserved
  while the job trains, so that a resize keeps the replicas that stay;
* :mod:`.failures`: which replica failed first, and why, in words (:class:`WorkerFailed`);
* :mod:`.transfer`: a checkpoint as bytes between nodes;
* :mod:`.bundles`: a replica's resource bundle on a chosen accelerator type;
* :mod:`.nodes`: node facts (usable, draining, lost) and where a job fits;
* :mod:`._ray_private`: the version-checked seam of Ray's internals.

It imports no front-end (:mod:`adaptdl_ray.tune`, :mod:`adaptdl_ray.cluster`,
:mod:`adaptdl_ray.cli`); they import it.
"""
