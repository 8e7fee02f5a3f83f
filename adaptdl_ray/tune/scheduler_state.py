"""The file in which AdaptDLScheduler keeps the decision core's state.

Tune 2.60 never calls a scheduler's ``save``/``restore``, so the scheduler writes the
core's :class:`~adaptdl_core.decision.CoreState` itself into the experiment directory (a
``.json`` file there is uploaded with the experiment state and downloaded again by
``Tuner.restore``); files written by earlier versions still load. The old names
``TrialRecord`` and ``SchedulerState`` still resolve here, with a ``DeprecationWarning``
(see :mod:`adaptdl_ray.tune.renamed`).
"""

from __future__ import annotations

from typing import Any

from adaptdl_core.decision.state import CoreState

__all__ = ["STATE_FILE"]

#: The state file's name in the experiment directory.
STATE_FILE = CoreState.FILE


def __getattr__(name: str) -> Any:
    """``TrialRecord`` and ``SchedulerState``: the core's types, with a warning.

    Raises:
        AttributeError: for any other missing name.
    """
    from adaptdl_ray.tune import renamed
    return renamed.resolve(__name__, name)
