"""Where the simulator's command line writes its result: checked before a run, written at
the end.

A simulation may run for minutes; an output path that cannot be written must be found
before it starts (:func:`check_out_path`), not after, when the result would be lost.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Union

__all__ = ["check_out_path", "write_json", "save_result"]


def check_out_path(path: Union[str, Path], name: str = "--out") -> Path:
    """``path`` as a :class:`~pathlib.Path` once it is known that a file can be written
    there: its directory exists and a file can be created in it, and ``path`` itself is
    not a directory. Nothing is left behind by the check.

    Arguments:
        name: how the message calls the argument.

    Raises:
        ValueError: naming ``name``, the path and what to fix.
    """
    out = Path(path)
    if str(path) == "" or out.is_dir():
        raise ValueError(f"{name} {str(path)!r} is a directory (or empty): give a file path "
                         "such as result.json")
    parent = out.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ValueError(f"{name} {str(path)!r}: {str(parent)!r} {what}; create the "
                         "directory first or choose another path")
    try:
        # Creating (and removing) a file is the only reliable test: permissions, a
        # read-only file system and quotas all show here.
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise ValueError(f"{name} {str(path)!r}: cannot create a file in {str(parent)!r} "
                         f"({e.strerror or e}); choose a writable directory") from None
    if out.exists() and not os.access(out, os.W_OK):
        raise ValueError(f"{name} {str(path)!r} exists and is not writable; choose another "
                         "path or change its permissions")
    return out


def write_json(path: Union[str, Path], data: Any) -> None:
    """Write ``data`` as indented, key-sorted JSON to ``path``.

    Raises:
        OSError: the write failed (the caller still holds ``data``).
        TypeError: ``data`` is not JSON-serialisable (nothing is written then).
    """
    text = json.dumps(data, indent=1, sort_keys=True)
    Path(path).write_text(text)


def save_result(path: Union[str, Path], data: Any) -> int:
    """The command line's last step: write ``data`` to ``path`` (:func:`write_json`);
    if that fails even though :func:`check_out_path` passed (disk full, the directory
    removed meanwhile), say so on stderr and write the JSON to stdout instead, so the
    result of the run is not lost.

    Returns:
        The exit status: 0 when written, 1 when it went to stdout instead.
    """
    try:
        write_json(path, data)
    except OSError as e:
        sys.stderr.write(f"error: could not write {str(path)!r} ({e}); the result JSON "
                         "follows on stdout\n")
        sys.stdout.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return 1
    return 0
