"""Ask Ray's autoscaler for the desired cluster size, and give it back when not wanted.

The policy decides how many nodes of one template the cluster should have
(:class:`adaptdl_core.policy.ClusterSizeRule`); :class:`ResourceRequester` turns that number
into one standing ``ray.autoscaler.sdk.request_resources(bundles=[template] * n)`` call.
Ray keeps such a request until the next call replaces it, and never scales below it, so
the requester replaces it whenever the size changes and withdraws it (an empty request)
when nothing beyond the cluster's baseline is wanted: nodes requested once are then free
to be idle-terminated again (the failure mode of ray-project/ray#19785). Ray's own
autoscaler adds and removes the nodes; there is no cloud code here.

``request_resources`` asks that the bundles *fit in the cluster as a whole* (Ray counts
what already runs), so ``n`` bundles of a whole node's resources mean "at least ``n``
nodes of this shape", the head node included if it has that shape.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional

from adaptdl_core import validation
from adaptdl_core.policy import NodeInfo

LOG = logging.getLogger(__name__)

__all__ = ["ResourceRequester"]

RequestFn = Callable[..., Any]


def _check_template(node_template: Any) -> Dict[str, float]:
    """The template as a plain dict, checked as the policy checks a node's resources."""
    try:
        resources = dict(NodeInfo(node_template).resources)
    except ValueError as exc:
        raise ValueError(f"node_template: {exc} (one node's resources, e.g. "
                         "{'CPU': 8, 'GPU': 1})") from None
    if not any(v > 0 for v in resources.values()):
        raise ValueError(f"node_template must give a positive amount of some resource, "
                         f"got {node_template!r}")
    # (Whole amounts stay ints: Ray's bundles read better that way.)
    return {k: int(v) if float(v).is_integer() else v for k, v in resources.items()}


def _ray_request_resources(**kwargs: Any) -> None:
    from ray.autoscaler.sdk import request_resources  # (imported when first needed)

    request_resources(**kwargs)


class ResourceRequester:
    """One standing autoscaler request for ``n`` nodes of a template.

    Thread-safe; every method is cheap when nothing changes (no call is made).

    Args:
        node_template: the resources of one node to add, e.g. ``{"CPU": 8, "GPU": 1}``
            (as Ray's node types declare them).
        baseline_nodes: nodes the cluster keeps without asking (Ray's ``min_workers``
            plus the head, if template-shaped); a desired size at or below it withdraws
            the request rather than pinning those nodes (default 0).
        request_fn: called as ``request_fn(bundles=[...])``; default
            ``ray.autoscaler.sdk.request_resources`` (needs ``ray.init`` first). Tests
            inject a recorder.

    Raises:
        ValueError: for a malformed argument; the message names it and its value.
    """

    def __init__(self, node_template: Mapping[str, float], *, baseline_nodes: int = 0,
                 request_fn: Optional[RequestFn] = None) -> None:
        self.node_template = _check_template(node_template)
        self.baseline_nodes = validation.integer("baseline_nodes", baseline_nodes, 0)
        if request_fn is not None and not callable(request_fn):
            raise ValueError(f"request_fn must be callable(bundles=[...]), got {request_fn!r}")
        self._request_fn = request_fn or _ray_request_resources
        self._lock = threading.Lock()
        # Nodes the standing request asks for (0: none stands). Unknown at first: a
        # request left by an earlier process may stand, so the first call always goes out.
        self._standing: Optional[int] = None

    @property
    def standing_nodes(self) -> Optional[int]:
        """Nodes the standing request asks for (0 when none stands; ``None`` before the
        first call, when a request left by an earlier process may stand)."""
        return self._standing

    def bundles(self, num_nodes: int) -> List[Dict[str, float]]:
        """The bundles that ask for ``num_nodes`` template nodes (one copy per node)."""
        return [dict(self.node_template) for _ in range(num_nodes)]

    def request(self, num_nodes: int) -> bool:
        """Make the standing request ask for ``num_nodes`` template nodes.

        A size at or below ``baseline_nodes`` withdraws it instead (see :meth:`withdraw`).
        Nothing is called when the size is the one already standing (the first call
        always goes out).

        Returns:
            True if the autoscaler was called.

        Raises:
            ValueError: if ``num_nodes`` is not an integer >= 0.
            Exception: whatever ``request_fn`` raises (the standing size is then unchanged,
                so the next call retries).
        """
        num_nodes = validation.integer("num_nodes", num_nodes, 0)
        wanted = num_nodes if num_nodes > self.baseline_nodes else 0
        with self._lock:
            if wanted == self._standing:
                return False
            self._request_fn(bundles=self.bundles(wanted))
            before, self._standing = self._standing or 0, wanted
        if wanted:
            LOG.info("asked the autoscaler for %d node(s) of %s (was %d)", wanted,
                     self.node_template, before)
        else:
            LOG.info("withdrew the autoscaler request for %d node(s) of %s", before,
                     self.node_template)
        return True

    def withdraw(self) -> bool:
        """Withdraw the standing request (``request_resources(bundles=[])``), so that the
        autoscaler may remove idle nodes again.

        Returns:
            True if the autoscaler was called (False when this requester had already
            withdrawn it).
        """
        return self.request(0)

    def __repr__(self) -> str:
        return (f"ResourceRequester(node_template={self.node_template!r}, "
                f"baseline_nodes={self.baseline_nodes}, standing_nodes={self._standing})")
