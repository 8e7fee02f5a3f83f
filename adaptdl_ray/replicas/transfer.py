"""Moving an adaptdl_core checkpoint between machines as bytes.

A trial's workers may run on any node and Tune's checkpoint storage may be remote, so a
checkpoint never relies on a shared filesystem: rank 0 packs its newest checkpoint
directory into an in-memory tar archive, the trainable writes it into Tune's checkpoint
directory (which Tune persists), and on restore every worker unpacks the same bytes,
handed over through the object store, into its own local checkpoint path.
"""

from __future__ import annotations

import io
import os
import tarfile

from adaptdl_core import checkpoint

__all__ = ["pack_latest_checkpoint", "pack_dir", "pack_entries", "unpack"]


def pack_dir(path: str, arcname: str) -> bytes:
    """Tar (uncompressed: model weights do not compress well) ``path`` as ``arcname``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(path, arcname=arcname)
    return buf.getvalue()


def pack_entries(directory: str, entries: list[str]) -> bytes:
    """Tar the given entries (files or directories) of ``directory`` under their own names."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry in entries:
            tar.add(os.path.join(directory, entry), arcname=entry)
    return buf.getvalue()


def pack_latest_checkpoint(checkpoint_root: str) -> bytes | None:
    """The newest complete checkpoint under ``checkpoint_root`` as tar bytes (its directory
    name kept, so its sequence number survives), or ``None`` if there is none."""
    latest = checkpoint.latest_checkpoint_dir(checkpoint_root)
    if latest is None:
        return None
    return pack_dir(latest, os.path.basename(latest))


def unpack(archive: bytes, dest: str) -> None:
    """Extract an archive made by :func:`pack_dir` into ``dest`` (created if needed).

    Raises:
        ValueError: if the archive holds anything but plain files and directories inside
            ``dest`` (a damaged or foreign archive).
    """
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            raise ValueError(f"refusing to unpack checkpoint archive: {exc}") from exc
