"""Small workloads cut from the vendored ones, shared by the simulator tests and
``benchmarks/sim_fingerprint.py``."""

from __future__ import annotations

import dataclasses
from typing import List

from adaptdl_core.sim.cluster import WorkloadJob, load_workload


def small_rows() -> List[WorkloadJob]:
    """The first bert jobs (up to four; the workload has three) and two ncf jobs of
    load-0.5/workload-1, at their submission times."""
    rows = load_workload("load-0.5/workload-1")
    return ([r for r in rows if r.application == "bert"][:4]
            + [r for r in rows if r.application == "ncf"][:2])


def contended_rows() -> List[WorkloadJob]:
    """Thirteen jobs of load-1.0/workload-2 (six cifar10, three ncf, two bert, two
    deepspeech2) arriving two minutes apart: on 8 GPUs they contend for most of the run."""
    rows = load_workload("load-1.0/workload-2")
    pick = ([r for r in rows if r.application == "cifar10"][:6]
            + [r for r in rows if r.application == "ncf"][:3]
            + [r for r in rows if r.application == "bert"][:2]
            + [r for r in rows if r.application == "deepspeech2"][:2])
    return [dataclasses.replace(r, time=120.0 * i) for i, r in enumerate(pick)]
