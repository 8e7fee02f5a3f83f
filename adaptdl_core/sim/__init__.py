"""Trace-driven simulation of training jobs on a GPU cluster (``python -m adaptdl_core.sim``).

:mod:`.job_model` models one job from the Pollux paper's real traces; :mod:`.cluster` runs a
workload of such jobs under a scheduling policy (``pollux``, ``tiresias``, ``optimus``).
"""
