"""Readers for the Pollux traces vendored in ``adaptdl_core/sim/data/traces`` (see the README
in ``adaptdl_core/sim/data``).

``step_time`` is one optimizer step without accumulation (the micro-batch that ends the
step, gradient sync included: ``T_o``); ``sync_time`` is the part blocked on the
all-reduce, so ``T_c = step_time - sync_time`` is the compute of one micro-batch.
"""

from __future__ import annotations

import csv

import numpy as np

from adaptdl_core.sim.job_model import TRACES_DIR as TRACES

MODELS = ("bert", "cifar10", "imagenet", "ncf")


def _read(model: str, name: str) -> list[dict]:
    with open(TRACES / model / name, newline="") as f:
        return list(csv.DictReader(f))


def _col(rows: list[dict], name: str) -> np.ndarray:
    return np.array([float(r[name]) for r in rows])


def load_placements(model: str) -> tuple[np.ndarray, ...]:
    """``(nodes, replicas, local_bsz, T_c, T_o)`` from ``placements.csv``, whose
    ``placement`` is one digit per node (the replicas on it)."""
    rows = _read(model, "placements.csv")
    placement = [r["placement"].strip() for r in rows]
    nodes = np.array([len(p) for p in placement], dtype=float)
    replicas = np.array([sum(int(c) for c in p) for p in placement], dtype=float)
    step = _col(rows, "step_time")
    return nodes, replicas, _col(rows, "local_bsz"), step - _col(rows, "sync_time"), step


def load_scalability(model: str) -> tuple[np.ndarray, ...]:
    """``(nodes, replicas, local_bsz, T_c, T_o)`` from ``scalability.csv``."""
    rows = _read(model, "scalability.csv")
    step = _col(rows, "step_time")
    return (_col(rows, "num_nodes"), _col(rows, "num_replicas"), _col(rows, "local_bsz"),
            step - _col(rows, "sync_time"), step)
