"""Everything AdaptDLScheduler remembers: the decision core's state, under its old names.

Tune 2.60 never calls a scheduler's ``save``/``restore``, so the scheduler writes this
state itself into the experiment directory (a ``.json`` file there is uploaded with the
experiment state and downloaded again by ``Tuner.restore``). The record and state types
live in :mod:`adaptdl_core.decision.state`; files written by earlier versions still load.
"""

from __future__ import annotations

from adaptdl_core.decision.state import CoreState, JobRecord

__all__ = ["TrialRecord", "SchedulerState", "STATE_FILE"]

#: What the scheduler knows about one trial (see :class:`JobRecord`).
TrialRecord = JobRecord
#: All trial records and when the cluster was last re-divided (see :class:`CoreState`).
SchedulerState = CoreState
#: The state file's name in the experiment directory.
STATE_FILE = CoreState.FILE
