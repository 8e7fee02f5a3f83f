"""Elastic jobs on a shared Ray cluster: ``adaptdl-ray submit`` and what it runs.

* :mod:`.elastic_job`: the driver of one submitted job (replica actors in a placement
  group it owns, checkpoint-restart resizes, stop and resume);
* :mod:`.sizing`: the seam between a job and the decision core that sizes it;
* :mod:`.job_files`: a job's checkpoint and records under its storage path.
"""
