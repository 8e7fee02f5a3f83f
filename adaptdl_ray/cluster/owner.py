"""Who runs a job or an experiment on a shared cluster: ``user@host`` of the process that
submitted it, recorded with it so that listings show it and the command line does not
stop or copy another person's job by mistake.

This guards against mistakes, not attacks: Ray has no per-user authorisation (anyone who
reaches the cluster can ``ray job stop`` any job). Teams that must be kept apart use
separate Ray namespaces (``ADAPTDL_RAY_NAMESPACE``) or separate clusters.
"""

from __future__ import annotations

import getpass
import socket

__all__ = ["current_owner"]


def current_owner() -> str:
    """``user@host`` of this process (``?`` for a part the system does not tell)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # (no name for this uid, e.g. in some containers)
        user = "?"
    return f"{user}@{socket.gethostname() or '?'}"
