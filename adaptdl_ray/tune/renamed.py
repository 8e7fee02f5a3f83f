"""Old names of public types, kept working with a :class:`DeprecationWarning`.

The Tune front-end once had its own names for the decision core's types; each type now has
one name, the core's (it is not Tune-specific):

========================================  ==========================================
old name (``adaptdl_ray.tune``)           the one name
========================================  ==========================================
``ReplicaSpec``                           :class:`adaptdl_core.decision.JobSpec`
``SchedulerState``                        :class:`adaptdl_core.decision.CoreState`
``TrialRecord``                           :class:`adaptdl_core.decision.JobRecord`
========================================  ==========================================

The old names are the same classes (so ``isinstance`` and pickled or saved states keep
working); only looking one up warns. Modules that defined an old name resolve it with
:func:`resolve` from their module ``__getattr__`` (PEP 562).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__all__ = ["RENAMED", "resolve"]

#: Old name -> (module of the one name, the one name).
RENAMED = {
    "ReplicaSpec": ("adaptdl_core.decision", "JobSpec"),
    "SchedulerState": ("adaptdl_core.decision", "CoreState"),
    "TrialRecord": ("adaptdl_core.decision", "JobRecord"),
}


def resolve(module: str, name: str) -> Any:
    """The class old ``name`` (looked up on ``module``) stands for, with a warning.

    Args:
        module: the module the name was looked up on, for the messages.
        name: the attribute asked for.

    Raises:
        AttributeError: ``name`` is not an old name (as for any missing attribute).
    """
    if name not in RENAMED:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new_module, new_name = RENAMED[name]
    # stacklevel 3: the warning points at the caller's lookup, not at the __getattr__.
    warnings.warn(f"{module}.{name} is deprecated: use {new_module}.{new_name} (the same "
                  "class under its one name)", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(new_module), new_name)
