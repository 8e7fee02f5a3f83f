"""What every verb of the command line shares: its name, its one-line errors, and the rule
that no contact with a cluster waits without bound."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator

__all__ = ["PROG", "CliError", "answer_within"]

#: The command's name, first word of every message.
PROG = "adaptdl-ray"


class CliError(Exception):
    """A failure the user can fix: printed as one line (``adaptdl-ray: error: ...``), exit
    status 1."""


@contextlib.contextmanager
def answer_within(seconds: float, what: str, fix: str) -> Iterator[None]:
    """Bound a call that waits on a cluster: if it has not returned after ``seconds``, say
    in one line that ``what`` did not answer and how to fix it, and end the process with
    status 1 (a call blocked inside Ray's client cannot be interrupted, and Ray's exit
    handlers would wait on the same connection)."""
    def give_up() -> None:
        sys.stderr.write(f"{PROG}: error: {what} did not answer within {seconds:g} s: {fix}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
