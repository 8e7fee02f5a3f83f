"""Mixed GPU clusters for the simulator: the GPU types the traces cover and cluster specs.

A :class:`ClusterSpec` is a list of node groups (GPU type, node count, GPUs per node). The
presets are the Sia paper's clusters (``sia-heterogeneous``: 6 t4 + 3 rtx + 2 a100 nodes,
64 GPUs; ``sia-homogeneous``: 16 t4 nodes); :func:`cluster_spec` also reads a small JSON or
TOML file::

    {"nodes": [{"type": "t4", "count": 6}, {"type": "a100", "count": 2, "gpus_per_node": 8}]}

The GPU types (:data:`GPU_TYPES`) are those the Sia artifact measured (``data/README.md``):
``t4`` (AWS g4dn.12xlarge, 4x T4), ``rtx`` (8x RTX 2080Ti), ``a100`` (DGX-A100, 8x A100),
``quad`` (4x Quadro RTX 6000) and ``v100`` (Azure ND40rs_v2, 8x V100). The constants below
are the Sia simulator's (facts from its code, recorded in ``data/README.md``): each model's
checkpoint-restore delay, the slowdown of real runs against the traced step times, and the
order in which a type-unaware scheduler's mixed allocation keeps a type.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from adaptdl_core import validation

__all__ = ["GPU_TYPES", "TRACE_SUFFIX", "GPUS_PER_NODE", "TRACED_NODES", "RESTART_DELAY_S",
           "CALIBRATION_SLOWDOWN", "TYPE_PREFERENCE", "NodeGroup", "ClusterSpec",
           "PRESETS", "cluster_spec", "preferred_type"]

#: File suffix of each GPU type's traces (``placements-<suffix>.csv``; ``""``: the Pollux
#: paper's own ``placements.csv``, byte for byte the artifact's T4 measurements).
TRACE_SUFFIX: Dict[str, str] = {"t4": "", "rtx": "rtx", "a100": "dgx-ext", "quad": "quad",
                                "v100": "azure"}
#: The GPU types the traces cover.
GPU_TYPES: Tuple[str, ...] = tuple(TRACE_SUFFIX)
#: GPUs per node of the traced hardware (a cluster file's default).
GPUS_PER_NODE: Dict[str, int] = {"t4": 4, "rtx": 8, "a100": 8, "quad": 4, "v100": 8}
#: Most nodes each type's traces measured one job on; larger placements are extrapolated
#: by the type's fitted throughput model (:class:`~adaptdl_core.sim.job_model.Application`).
TRACED_NODES: Dict[str, int] = {"t4": 16, "rtx": 3, "a100": 2, "quad": 1, "v100": 5}
#: Seconds a checkpoint-restore of each model costs (measured on a real cluster by the Sia
#: authors; used on typed clusters instead of one delay for every model).
RESTART_DELAY_S: Dict[str, float] = {"cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0,
                                     "yolov3": 80.0, "imagenet": 250.0, "ncf": 15.0}
#: How much slower the real runs trained than the traced step times say (the Sia
#: simulator's calibration against real rtx runs): progress per second is divided by it.
CALIBRATION_SLOWDOWN: Dict[str, float] = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2,
                                          "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5}
#: A type-unaware allocation spanning types keeps the type holding most of its GPUs; on a
#: tie the earlier type of this order (the Sia paper's: a100 > quad > rtx > t4).
TYPE_PREFERENCE: Tuple[str, ...] = ("a100", "v100", "quad", "rtx", "t4")

_NAME_HELP = ", ".join(GPU_TYPES)


@dataclass(frozen=True)
class NodeGroup:
    """``count`` nodes of ``gpus_per_node`` GPUs of type ``gpu_type``.

    Raises:
        ValueError: an unknown type (the message lists the known ones) or a count that is
            not an integer ``>= 1``.
    """

    gpu_type: str
    count: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.gpu_type not in TRACE_SUFFIX:
            raise ValueError(f"GPU type {self.gpu_type!r} has no traces; use one of "
                             f"{_NAME_HELP}")
        validation.integer("count", self.count, 1)
        validation.integer("gpus_per_node", self.gpus_per_node, 1, 64)


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster of typed nodes, numbered 0, 1, ... in group order.

    Attributes:
        name: what results call it (a preset's name or the file's).
        groups: the node groups.
    """

    name: str
    groups: Tuple[NodeGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a cluster needs at least one node group")

    def _node_groups(self) -> Dict[int, NodeGroup]:
        """Node id -> its group."""
        ids = [g for g in self.groups for _ in range(g.count)]
        return dict(enumerate(ids))

    def node_gpus(self) -> Dict[int, int]:
        """Node id -> GPUs."""
        return {n: g.gpus_per_node for n, g in self._node_groups().items()}

    def node_types(self) -> Dict[int, str]:
        """Node id -> GPU type."""
        return {n: g.gpu_type for n, g in self._node_groups().items()}

    @property
    def types(self) -> Tuple[str, ...]:
        """The GPU types present, in group order, each once."""
        return tuple(dict.fromkeys(g.gpu_type for g in self.groups))

    def gpus_by_type(self) -> Dict[str, int]:
        """GPU type -> GPUs of that type in the cluster."""
        out: Dict[str, int] = {}
        for g in self.groups:
            out[g.gpu_type] = out.get(g.gpu_type, 0) + g.count * g.gpus_per_node
        return out

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(self.gpus_by_type().values())

    def describe(self) -> str:
        """One line, e.g. ``"6x4 t4 + 2x8 a100"``."""
        return " + ".join(f"{g.count}x{g.gpus_per_node} {g.gpu_type}" for g in self.groups)


def _groups(*items: Tuple[str, int]) -> Tuple[NodeGroup, ...]:
    return tuple(NodeGroup(t, n, GPUS_PER_NODE[t]) for t, n in items)


#: The Sia paper's clusters.
PRESETS: Dict[str, ClusterSpec] = {
    "sia-heterogeneous": ClusterSpec("sia-heterogeneous",
                                     _groups(("t4", 6), ("rtx", 3), ("a100", 2))),
    "sia-homogeneous": ClusterSpec("sia-homogeneous", _groups(("t4", 16))),
}


def _from_data(name: str, data: Any, source: str) -> ClusterSpec:
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list) \
            or not data["nodes"]:
        raise ValueError(f"{source}: expected a 'nodes' list, e.g. "
                         '{"nodes": [{"type": "t4", "count": 6}]}')
    groups = []
    for i, item in enumerate(data["nodes"]):
        if not isinstance(item, Mapping) or "type" not in item or "count" not in item:
            raise ValueError(f"{source}: nodes[{i}] needs 'type' and 'count' (and optionally "
                             "'gpus_per_node')")
        unknown = set(item) - {"type", "count", "gpus_per_node"}
        if unknown:
            raise ValueError(f"{source}: nodes[{i}] has unknown keys {sorted(unknown)}; "
                             "allowed: type, count, gpus_per_node")
        gpu_type = item["type"]
        try:
            groups.append(NodeGroup(gpu_type, item["count"],
                                    item.get("gpus_per_node", GPUS_PER_NODE.get(gpu_type, 0))))
        except ValueError as e:
            raise ValueError(f"{source}: nodes[{i}]: {e}") from None
    return ClusterSpec(name, tuple(groups))


def cluster_spec(spec: Union[str, Path, ClusterSpec]) -> ClusterSpec:
    """The cluster called ``spec``: a :class:`ClusterSpec`, a preset name
    (:data:`PRESETS`), or a ``.json`` / ``.toml`` file (see the module doc).

    Raises:
        ValueError: an unknown name or a malformed file (naming the entry and the fix).
        FileNotFoundError: a path that does not exist.
    """
    if isinstance(spec, ClusterSpec):
        return spec
    text = str(spec)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if path.suffix.lower() not in (".json", ".toml"):
        raise ValueError(f"cluster {text!r}: not a preset ({', '.join(PRESETS)}) nor a "
                         ".json/.toml file")
    if not path.is_file():
        raise FileNotFoundError(f"cluster file {text!r} does not exist")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            import tomllib
            data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"cluster file {text!r} is not valid {path.suffix[1:].upper()}: "
                         f"{e}") from None
    return _from_data(path.stem, data, f"cluster file {text!r}")


def preferred_type(counts: Mapping[str, int]) -> Optional[str]:
    """The type a type-unaware allocation keeps: the one with most GPUs in ``counts``
    (type -> GPUs), ties broken by :data:`TYPE_PREFERENCE`; ``None`` for no GPUs."""
    best = None
    for t, n in counts.items():
        if n <= 0:
            continue
        rank = TYPE_PREFERENCE.index(t) if t in TYPE_PREFERENCE else math.inf
        key = (-n, rank, t)
        if best is None or key < best[0]:
            best = (key, t)
    return None if best is None else best[1]
