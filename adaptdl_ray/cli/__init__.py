"""``adaptdl-ray``: submit, list, follow, stop and collect elastic jobs on a Ray cluster.

::

    adaptdl-ray submit --name digits --max-replicas 4 train.py --epochs 10
    adaptdl-ray ls
    adaptdl-ray logs digits -f
    adaptdl-ray stop digits          # checkpoint at the next batch, then stop
    adaptdl-ray submit --name digits --max-replicas 4 train.py --epochs 10   # resumes
    adaptdl-ray cp digits ./digits-checkpoint

(also ``python -m adaptdl_ray``). Jobs run through Ray's Job Submission API: each
``submit`` is one Ray job (submission id ``adaptdl-<name>-<k>``, the job's name and owner
in its metadata) whose entrypoint is :mod:`adaptdl_ray.cluster.elastic_job`. Which cluster
a command talks to, and how: :mod:`.cluster`. A job's checkpoint and records live under its
storage path (see :mod:`adaptdl_ray.cluster.job_files`), which ``cp``, ``ls`` and
``tensorboard`` read from this machine: a local cluster, or storage shared with the cluster.

The package, one module a job: :mod:`.main` (the parser), :mod:`.job_verbs` (submit, logs,
stop, cp, tensorboard), :mod:`.listing` (ls), :mod:`.allocator_verbs` (start, status),
:mod:`.cluster` and :mod:`.gcs_address` (reaching the cluster), :mod:`.submissions` (jobs
as Ray holds them), :mod:`.errors`.
"""

from adaptdl_ray.cli.errors import CliError
from adaptdl_ray.cli.main import build_parser, main

__all__ = ["CliError", "build_parser", "main"]
