"""Whether resizing a running job pays for itself (pure arithmetic; no torch, no Ray).

A resize stops a job at a batch boundary, checkpoints it and relaunches it: for
``cost_s`` seconds it makes no progress. The allocator weighs restarts against goodput
across the whole cluster (``restart_penalty``); this check is the job's own, applied to
every resize a policy proposes:

* a job whose remaining training is not known yet is not grown (whether a growth pays
  cannot be told); it can still be shrunk for other jobs;
* a job with less training left than ``min_cost_multiples`` resize costs is left as it is
  (however the cluster would gain, it would spend a large part of its remaining time
  restarting);
* a job is *grown* only when the time the growth saves over its remaining training,
  ``remaining_s * (1 - speedup_now / speedup_new)``, exceeds the resize cost.

A shrink serves other jobs (or, when the job's own model predicts fewer replicas as fast,
the job itself: its reason then says so), so only the first rule applies to it. A move to
another accelerator type (:func:`move_verdict`) is judged by the speedups on the two types:
one that makes the job faster as a growth, one that makes it slower (for other jobs) as a
shrink.
"""

from __future__ import annotations

import dataclasses
import operator

from adaptdl_core import validation

__all__ = ["ResizeVerdict", "resize_verdict", "amortised_resize_verdict", "move_verdict",
           "MIN_COST_MULTIPLES", "AMORTISE_MULTIPLES", "MIN_DWELL_S"]

# A job with less than this many resize costs of training left is not resized.
MIN_COST_MULTIPLES = 2.0
#: A job resized in place is not resized again before its last resize is measured and it
#: has trained this many times that resize's cost since...
AMORTISE_MULTIPLES = 10.0
#: ...and at least this long (seconds): long enough for its throughput model to see the
#: new size, so that a noisy first fit does not undo a resize at once.
MIN_DWELL_S = 10.0


@dataclasses.dataclass(frozen=True)
class ResizeVerdict:
    """The answer of :func:`resize_verdict`.

    Attributes:
        pays: resize the job.
        reason: one line saying why (for logs and users).
        saved_s: predicted seconds the resize saves over the job's remaining training
            (growth only; ``None`` when not computed).
    """

    pays: bool
    reason: str
    saved_s: float | None = None


def _count(name: str, value: object) -> int:
    """A replica count: an integer (numpy integers included, bools not) ``>= 1``."""
    if not isinstance(value, bool) and hasattr(value, "__index__"):
        value = operator.index(value)
    return validation.integer(name, value, 1)


def resize_verdict(*, current: int, target: int, remaining_s: float | None, cost_s: float,
                   speedup_now: float | None = None, speedup_new: float | None = None,
                   min_cost_multiples: float = MIN_COST_MULTIPLES,
                   **_: object) -> ResizeVerdict:
    """Whether moving a running job from ``current`` to ``target`` replicas pays.

    Args:
        current, target: replica counts now and proposed (``current >= 1``).
        remaining_s: estimated seconds of training left at the current size (``None``:
            unknown yet; then the job is not grown until it is known).
        cost_s: seconds one resize costs the job (measured, or a prior).
        speedup_now, speedup_new: the job's predicted speedups (any common unit) at the two
            sizes; needed for a growth when ``remaining_s`` is known.
        min_cost_multiples: see :data:`MIN_COST_MULTIPLES`.

    Other keyword arguments (what the decision core knows of the job's last resize) are
    for other rules (:func:`amortised_resize_verdict`) and ignored here.

    Raises:
        ValueError: for counts that are not integers ``>= 1``, a ``remaining_s`` or
            ``cost_s`` that is not a finite number of seconds ``>= 0``, a speedup that is
            not a finite number ``>= 0``, a ``min_cost_multiples`` that is not a finite
            number ``>= 0``, or a growth with a known remaining time but no speedups (the
            message names the argument).
    """
    current = _count("current", current)
    target = _count("target", target)
    if remaining_s is not None:
        remaining_s = validation.number("remaining_s", remaining_s, 0.0,
                                        what="None or a finite number of seconds")
    cost_s = validation.number("cost_s", cost_s, 0.0, what="a finite number of seconds")
    for name, value in (("speedup_now", speedup_now), ("speedup_new", speedup_new)):
        if value is not None:
            validation.number(name, value, 0.0, what="None or a finite speedup")
    min_cost_multiples = validation.number("min_cost_multiples", min_cost_multiples, 0.0)
    if target == current:
        return ResizeVerdict(False, "no change")
    if remaining_s is None and target > current:
        # Whether a growth pays cannot be told, and a short job would spend its life
        # restarting (a 2-epoch trial grown blind spent most of it relaunching); it is known
        # once the job has finished an epoch of a known number. A shrink serves other jobs:
        # a newly arrived job must not wait a whole epoch of the others for its share.
        return ResizeVerdict(False, "remaining training not known: it is known once the "
                                    "script has finished an epoch of `for epoch in "
                                    "adl.remaining_epochs_until(N)` (a script without that "
                                    "loop is never grown)")
    if remaining_s is None:
        return ResizeVerdict(True, "shrink for other jobs (remaining training not known "
                                   "yet)")
    if remaining_s < min_cost_multiples * cost_s:
        return ResizeVerdict(False, f"{remaining_s:.1f} s of training left, under "
                                    f"{min_cost_multiples:g} resize costs of {cost_s:.1f} s")
    if target < current:
        if speedup_now and speedup_new is not None and speedup_new >= speedup_now:
            return ResizeVerdict(True, f"fewer replicas are predicted as fast: "
                                       f"x{speedup_new / speedup_now:.2f} at {target} "
                                       f"({remaining_s:.1f} s left, resize cost "
                                       f"{cost_s:.1f} s)")
        return ResizeVerdict(True, f"shrink for other jobs ({remaining_s:.1f} s left, "
                                   f"resize cost {cost_s:.1f} s)")
    if speedup_now is None or speedup_new is None:
        raise ValueError("a growth with a known remaining time needs speedup_now and "
                         "speedup_new")
    if not speedup_new > 0 or not speedup_now > 0:
        return ResizeVerdict(False, "no predicted speedup")
    saved = remaining_s * (1.0 - speedup_now / speedup_new)
    ratio = speedup_new / speedup_now
    if saved <= cost_s:
        return ResizeVerdict(False, f"predicted speedup x{ratio:.2f} saves {saved:.1f} s of "
                                    f"{remaining_s:.1f} s left, not more than the resize cost "
                                    f"{cost_s:.1f} s", saved)
    return ResizeVerdict(True, f"predicted speedup x{ratio:.2f} saves {saved:.1f} s of "
                               f"{remaining_s:.1f} s left, more than the resize cost "
                               f"{cost_s:.1f} s", saved)


def amortised_resize_verdict(*, since_last_s: float | None = None,
                             last_cost_s: float | None = None,
                             **kwargs: object) -> ResizeVerdict:
    """:func:`resize_verdict`, and a job is not resized again before its last resize has
    been measured (``last_cost_s`` known) and amortised: it has trained at least
    :data:`AMORTISE_MULTIPLES` times that cost since, and at least :data:`MIN_DWELL_S`.

    The rule for jobs that resize in place (a Ray Tune trial, a submitted job): a resize
    that costs a second pays easily, and without this a young throughput model, fitted on
    a few steps at a new size, could undo the resize at once and the job thrash between
    sizes. (A front-end's forced moves, off a draining or lost node, are no decisions of the
    rule and are never held.)

    Args:
        since_last_s: seconds since the job's last resize began (``None``: never resized).
        last_cost_s: what that resize cost, measured (``None``: not measured yet).
        kwargs: :func:`resize_verdict`'s arguments.

    Raises:
        ValueError: as :func:`resize_verdict`, or a negative or non-finite
            ``since_last_s`` / ``last_cost_s``.
    """
    if since_last_s is not None:
        since = validation.number("since_last_s", since_last_s, 0.0, what="seconds")
        if kwargs.get("current") != kwargs.get("target"):
            # (The reasons name no elapsed time: the same hold then reads the same at
            # every solve, and is logged once, not once a solve.)
            if last_cost_s is None:
                return ResizeVerdict(False, "its last resize is not measured yet")
            cost = validation.number("last_cost_s", last_cost_s, 0.0, what="seconds")
            needed = max(AMORTISE_MULTIPLES * cost, MIN_DWELL_S)
            if since < needed:
                return ResizeVerdict(False, f"its last resize ({cost:.1f} s) is amortised "
                                            f"after {needed:.0f} s at its size "
                                            f"({AMORTISE_MULTIPLES:g}x its cost, at least "
                                            f"{MIN_DWELL_S:g} s)")
    return resize_verdict(**kwargs)


def move_verdict(*, remaining_s: float | None, cost_s: float, speedup_now: float,
                 speedup_new: float,
                 min_cost_multiples: float = MIN_COST_MULTIPLES) -> ResizeVerdict:
    """Whether moving a running job to nodes of another accelerator type pays (see the
    module doc): ``speedup_now`` and ``speedup_new`` are its speedups (one unit across
    types) where it runs and where it would run.

    Raises:
        ValueError: a ``remaining_s``, ``cost_s`` or speedup that is not a finite number
            ``>= 0`` (named).
    """
    if remaining_s is not None:
        remaining_s = validation.number("remaining_s", remaining_s, 0.0,
                                        what="None or a finite number of seconds")
    cost_s = validation.number("cost_s", cost_s, 0.0, what="a finite number of seconds")
    speedup_now = validation.number("speedup_now", speedup_now, 0.0)
    speedup_new = validation.number("speedup_new", speedup_new, 0.0)
    faster = speedup_new > speedup_now
    if remaining_s is None:
        if faster:
            return ResizeVerdict(False, "remaining training not known yet: whether a move "
                                        "to a faster type pays cannot be told")
        return ResizeVerdict(True, "moved for other jobs (remaining training not known yet)")
    if remaining_s < min_cost_multiples * cost_s:
        return ResizeVerdict(False, f"{remaining_s:.1f} s of training left, under "
                                    f"{min_cost_multiples:g} resize costs of {cost_s:.1f} s")
    if not faster:
        return ResizeVerdict(True, f"moved for other jobs ({remaining_s:.1f} s left, "
                                   f"resize cost {cost_s:.1f} s)")
    saved = remaining_s * (1.0 - speedup_now / speedup_new) if speedup_now > 0 else remaining_s
    if saved <= cost_s:
        return ResizeVerdict(False, f"moving saves {saved:.1f} s of {remaining_s:.1f} s left, "
                                    f"not more than the resize cost {cost_s:.1f} s", saved)
    return ResizeVerdict(True, f"moving saves {saved:.1f} s of {remaining_s:.1f} s left, "
                               f"more than the resize cost {cost_s:.1f} s", saved)
