"""AdaptDLScheduler's arguments: their checks, and which trials share a throughput profile.

Kept apart from the scheduler so that its class holds only the translation of Tune's events
(see :mod:`adaptdl_ray.tune.scheduler`).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping

from adaptdl_core.policy import policy_by_name

LOG = logging.getLogger(__name__)

__all__ = ["MISSING", "ProfileGroups", "checked_policy", "check_arguments", "profile_group"]


def _is_seconds(value: Any, *, zero_ok: bool = False) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and \
        math.isfinite(value) and (value >= 0 if zero_ok else value > 0)


def checked_policy(policy: Any, p: float) -> Any:
    """The policy object ``policy`` names (``None``: the default, chosen by the caller).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
        TypeError: an object without an ``allocate()`` method.
    """
    if isinstance(policy, str):
        policy = policy_by_name(policy, p)
    if policy is not None and not callable(getattr(policy, "allocate", None)):
        raise TypeError(f"policy must be an allocation policy such as PolluxPolicy() "
                        f"(with an allocate() method), got {policy!r}")
    return policy


def check_arguments(*, base_scheduler: Any, allocation_interval_s: Any, p: Any,
                    solve_wait_s: Any, functions: Mapping[str, Any],
                    cluster_allocator: Any, share_profiles: Any) -> None:
    """Check AdaptDLScheduler's arguments (see its docstring for what each means; the
    decision core checks ``resize_cost_prior_s``).

    Raises:
        TypeError: an argument of the wrong kind (``functions``: name -> a value that must
            be ``None`` or callable).
        ValueError: a value out of range (the message names the argument and the fix).
    """
    from ray.tune.schedulers import TrialScheduler

    if base_scheduler is not None and not isinstance(base_scheduler, TrialScheduler):
        raise TypeError(f"base_scheduler must be a ray.tune TrialScheduler instance such as "
                        f"ASHAScheduler(), got {base_scheduler!r}")
    if not _is_seconds(allocation_interval_s):
        raise ValueError(f"allocation_interval_s must be a finite number of seconds > 0, "
                         f"got {allocation_interval_s!r}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p):
        raise ValueError(f"p must be a finite number (-1: fair, 1: total goodput), got {p!r}")
    if solve_wait_s is not None and not _is_seconds(solve_wait_s, zero_ok=True):
        raise ValueError(f"solve_wait_s must be a finite number of seconds >= 0 or None "
                         f"(always wait), got {solve_wait_s!r}")
    for name, fn in functions.items():
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function, got {fn!r}")
    if cluster_allocator is not None and not isinstance(cluster_allocator, bool):
        raise TypeError(f"cluster_allocator must be True, False or None (share when on "
                        f"Ray), got {cluster_allocator!r}")
    if not isinstance(share_profiles, (bool, str)) and not callable(share_profiles):
        raise TypeError(f"share_profiles must be True, False, the name of a config entry "
                        f"or a function of the trial's config, got {share_profiles!r}")
    if isinstance(share_profiles, str) and not share_profiles.strip("/"):
        raise ValueError("share_profiles must name a config entry (e.g. 'model_size'), got an "
                         "empty name; pass True or False to share among all or none")


#: The end of the profile group of a trial without the config entry ``share_profiles`` names.
MISSING = ": missing"


def profile_group(share: bool | str | Callable[[dict], Any],
                  config: Mapping[str, Any] | None) -> str | None:
    """The profile group of a trial with ``config`` under ``share_profiles`` (``None``: it
    shares none). A trial without the named config entry shares with the others without
    it (its group ends with :data:`MISSING`)."""
    if share is False:
        return None
    if share is True:
        return "all-trials"
    config = config or {}
    if isinstance(share, str):
        value: Any = config
        for part in (p for p in share.split("/") if p):
            if not isinstance(value, Mapping) or part not in value:
                return share + MISSING
            value = value[part]
        return f"{share}={value!r}"
    key = share(config)
    return None if key is None else f"key={key!r}"


class ProfileGroups:
    """:func:`profile_group` under one scheduler's ``share_profiles``, naming the first
    trial without the config entry it names (once: a sweep has many such trials)."""

    def __init__(self, share: bool | str | Callable[[dict], Any]) -> None:
        self.share = share
        self._warned = False

    def of(self, trial_id: str, config: Mapping[str, Any] | None) -> str | None:
        """The profile group of trial ``trial_id`` with ``config``."""
        group = profile_group(self.share, config)
        if group is not None and group.endswith(MISSING) and not self._warned:
            self._warned = True
            LOG.warning("trial %s has no config entry %r (share_profiles): it shares a "
                        "throughput profile with the other trials without it", trial_id,
                        self.share)
        return group
