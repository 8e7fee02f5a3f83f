"""Scheduler hints: what a training job publishes so that a scheduler can model its goodput.

A job fits its throughput model (:class:`~adaptdl_core.goodput.PerfParams`), measures its
gradient noise (:class:`~adaptdl_core.goodput.GradParams`) and knows its batch-size limits;
:class:`SchedHints` carries these as a small JSON document. A scheduler rebuilds the goodput
model with :meth:`SchedHints.goodput_function`. No torch or ray dependency.

JSON layout (all keys optional except ``init_batch_size``; unknown keys are ignored so that
newer jobs can talk to older schedulers)::

    {"perf_params": {"alpha_c": ..., ..., "gamma": ...} | null,
     "grad_params": {"sqr": ..., "var": ...} | null,
     "init_batch_size": 128, "max_batch_size": 4096 | null,
     "local_bsz_bounds": [32, 512] | null, "gradient_accumulation": false,
     "max_profiled_replicas": 0, "max_profiled_nodes": 0, "restart_cost_s": 30.0 | null}
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional, Tuple

from adaptdl_core import validation
from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams, check_perf_params

__all__ = ["SchedHints"]


def _as_int(name: str, value: Any, minimum: int) -> int:
    """A count from a hints dict (JSON may carry ``64.0``): see :func:`validation.integer`."""
    return validation.integer(name, value, minimum, integral_floats=True)


def _as_named_floats(name: str, value: Any, cls):
    """Convert a mapping (by field name) or a sequence (by position) to ``cls``."""
    fields = cls._fields
    if isinstance(value, Mapping):
        missing = [f for f in fields if f not in value]
        if missing:
            raise ValueError(f"{name} is missing {', '.join(missing)}")
        items = [value[f] for f in fields]
    elif isinstance(value, (list, tuple)):
        if len(value) != len(fields):
            raise ValueError(f"{name} must have {len(fields)} entries, got {len(value)}")
        items = list(value)
    else:
        raise ValueError(f"{name} must be a mapping or a sequence, got {type(value).__name__}")
    return cls(*[validation.number(f"{name}.{field}", item)
                 for field, item in zip(fields, items)])


@dataclasses.dataclass
class SchedHints:
    """Everything a scheduler needs to predict a job's goodput on any allocation.

    Attributes:
        perf_params: fitted throughput model, or ``None`` before any profile exists.
            Validated: finite, alphas/betas ``>= 0``, ``gamma > 0``, ``alpha_c + beta_c > 0``.
        grad_params: gradient statistics ``(sqr, var)``, or ``None`` before any estimate.
            Any finite values (a noisy ``sqr`` may be ``<= 0``; the goodput model treats that
            pessimistically).
        init_batch_size: the user's initial total batch size ``M0`` (integer ``>= 1``).
        max_batch_size: the largest total batch the job accepts (``>= init_batch_size``);
            ``None`` means the batch size is not adapted.
        local_bsz_bounds: ``(lo, hi)`` per-replica micro-batch bounds, each an integer
            ``>= 1`` or ``None``; ``lo <= hi`` when both are given. ``None`` for no bounds.
        gradient_accumulation: whether the job may use gradient accumulation.
        max_profiled_replicas: the largest replica count the job has been profiled at.
        max_profiled_nodes: the largest node count it has been profiled at
            (``<= max_profiled_replicas``).
        restart_cost_s: measured seconds one checkpoint-restart costs, ``None`` if unknown.

    Sequences given for ``perf_params`` / ``grad_params`` / ``local_bsz_bounds`` are
    converted to :class:`PerfParams` / :class:`GradParams` / tuple on construction.

    Raises:
        ValueError: on construction, if a field is malformed (the message names it).
    """

    perf_params: Optional[PerfParams]
    grad_params: Optional[GradParams]
    init_batch_size: int
    max_batch_size: Optional[int] = None
    local_bsz_bounds: Optional[Tuple[Optional[int], Optional[int]]] = None
    gradient_accumulation: bool = False
    max_profiled_replicas: int = 0
    max_profiled_nodes: int = 0
    restart_cost_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.perf_params is not None:
            self.perf_params = check_perf_params(
                _as_named_floats("perf_params", self.perf_params, PerfParams))
        if self.grad_params is not None:
            self.grad_params = _as_named_floats("grad_params", self.grad_params, GradParams)
        self.init_batch_size = _as_int("init_batch_size", self.init_batch_size, 1)
        if self.max_batch_size is not None:
            self.max_batch_size = _as_int("max_batch_size", self.max_batch_size, 1)
            if self.max_batch_size < self.init_batch_size:
                raise ValueError(
                    f"max_batch_size ({self.max_batch_size}) must be >= init_batch_size "
                    f"({self.init_batch_size})")
        if self.local_bsz_bounds is not None:
            bounds = self.local_bsz_bounds
            if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
                raise ValueError(f"local_bsz_bounds must be a pair (lo, hi), got {bounds!r}")
            lo, hi = (None if v is None else _as_int("local_bsz_bounds", v, 1) for v in bounds)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"local_bsz_bounds: lo ({lo}) must be <= hi ({hi})")
            self.local_bsz_bounds = (lo, hi)
        if not isinstance(self.gradient_accumulation, bool):
            raise ValueError(
                f"gradient_accumulation must be a bool, got {self.gradient_accumulation!r}")
        self.max_profiled_replicas = _as_int("max_profiled_replicas",
                                             self.max_profiled_replicas, 0)
        self.max_profiled_nodes = _as_int("max_profiled_nodes", self.max_profiled_nodes, 0)
        if self.max_profiled_nodes > self.max_profiled_replicas:
            raise ValueError(
                f"max_profiled_nodes ({self.max_profiled_nodes}) must be <= "
                f"max_profiled_replicas ({self.max_profiled_replicas})")
        if self.restart_cost_s is not None:
            self.restart_cost_s = validation.number("restart_cost_s", self.restart_cost_s, 0.0)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (named-tuple fields become objects keyed by name)."""
        return {
            "perf_params": None if self.perf_params is None else self.perf_params.to_dict(),
            "grad_params": None if self.grad_params is None else self.grad_params.to_dict(),
            "init_batch_size": self.init_batch_size,
            "max_batch_size": self.max_batch_size,
            "local_bsz_bounds": None if self.local_bsz_bounds is None
            else list(self.local_bsz_bounds),
            "gradient_accumulation": self.gradient_accumulation,
            "max_profiled_replicas": self.max_profiled_replicas,
            "max_profiled_nodes": self.max_profiled_nodes,
            "restart_cost_s": self.restart_cost_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SchedHints":
        """Build from a dict as produced by :meth:`to_dict`.

        ``init_batch_size`` is required; other keys default as in the dataclass; unknown
        keys are ignored (forward compatibility). ``perf_params`` / ``grad_params`` may be
        objects keyed by field name or lists in field order.

        Raises:
            ValueError: if ``d`` is not a mapping, ``init_batch_size`` is missing, or a field
                has a wrong type or value (the message names the field).
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"SchedHints.from_dict expects a mapping, got {type(d).__name__}")
        if "init_batch_size" not in d:
            raise ValueError("init_batch_size is required")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {key: value for key, value in d.items() if key in known}
        kwargs.setdefault("perf_params", None)
        kwargs.setdefault("grad_params", None)
        for key in ("max_profiled_replicas", "max_profiled_nodes"):
            if kwargs.get(key, 0) is None:
                raise ValueError(f"{key} must be an integer, got None")
        if "gradient_accumulation" in kwargs and kwargs["gradient_accumulation"] is None:
            raise ValueError("gradient_accumulation must be a bool, got None")
        return cls(**kwargs)

    def to_json(self) -> str:
        """Serialise to a JSON string (strict JSON: no NaN/Infinity)."""
        return json.dumps(self.to_dict(), allow_nan=False, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "SchedHints":
        """Parse a JSON string produced by :meth:`to_json`.

        Raises:
            ValueError: on malformed JSON (``json.JSONDecodeError`` is a ``ValueError``) or
                any error of :meth:`from_dict`.
        """
        return cls.from_dict(json.loads(s))

    def goodput_function(self) -> Optional[GoodputFunction]:
        """The job's :class:`GoodputFunction`, or ``None`` if perf or grad params are missing."""
        if self.perf_params is None or self.grad_params is None:
            return None
        return GoodputFunction(self.perf_params, self.grad_params, self.init_batch_size)
