"""One Ray cluster shared by every AdaptDL experiment and job.

* :mod:`.allocator`: the cluster allocator, a Ray actor that divides the cluster among
  every AdaptDL job on it (one solve over all of them, see
  :class:`~adaptdl_core.decision.SharedSolve`);
* :mod:`.client`: finding and starting it, and the solver through which a front-end's
  decision core shares the cluster (:class:`~.client.AllocatorSolver`);
* :mod:`.elastic_job`: the driver of one job submitted by ``adaptdl-ray submit``
  (checkpoint-restart resizes that keep the replicas that stay, stop and resume);
* :mod:`.replicas`: a job's replica actors, each in a placement group of its own;
* :mod:`.sizing`: the seam between such a job and the decision core that sizes it;
* :mod:`.job_files`: a job's checkpoint and records under its storage path.
"""
