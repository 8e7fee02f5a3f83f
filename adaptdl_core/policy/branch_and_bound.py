"""Step 3b of a round: depth-first branch and bound over placements, for small rounds.

Runs when the local search's result misses an exact DP bound and at most
``_BNB_MAX_JOBS`` jobs are movable. Jobs are placed one at a time (largest first), each
over all its placements up to node symmetry; a subtree is cut when its cost so far plus
the DP bound of the remaining jobs on the capacity left cannot beat the incumbent. Within
``max_bnb_nodes`` tree nodes (and the optional deadline) small instances (a few jobs and
nodes) complete, which proves the incumbent **optimal**; otherwise the search proves
nothing and the incumbent is kept.
"""

from __future__ import annotations

import time
from typing import Dict, List, Tuple

import numpy as np

from .fitness import _better, _Key
from .placement import _State
from .replica_counts import _knapsack, _Relaxation

# Branch and bound only runs for at most this many movable jobs.
_BNB_MAX_JOBS = 12


class _BranchAndBound(_Relaxation):
    """Exhaustive search certified by the DP's suffix bounds."""

    max_bnb_nodes: int      # budget of search-tree nodes (set by the solver)

    def _placements(self, j: int, state: _State, static_cls: List[Tuple]
                    ) -> Tuple[List[Tuple[Tuple[float, float], np.ndarray]], bool]:
        """All placements of job ``j`` in ``state`` up to node symmetry, best first.

        Nodes are interchangeable when their free capacity, multi-node host status,
        preemptibility and base counts (of every job) agree. Returns the placements and
        whether the enumeration was exhaustive (multi-node splits are capped).
        """
        prob = self.prob
        opts = self.options[j]
        fits = prob.fits(j, state.free)
        hosted = state.host >= 0
        cls = [(tuple(np.round(state.free[n], 9)), bool(hosted[n])) + static_cls[n]
               for n in range(prob.M)]
        cls_id: Dict[Tuple, int] = {}
        ids = np.array([cls_id.setdefault(c, len(cls_id)) for c in cls], dtype=np.int64)
        upper = max(int(fits.max(initial=0)), int(fits[~hosted].sum()))
        out: Dict[Tuple, Tuple[Tuple[float, float], np.ndarray]] = {}
        exhaustive = True

        def add(counts: np.ndarray) -> None:
            nz = np.flatnonzero(counts)
            key = tuple(sorted(zip(ids[nz].tolist(), counts[nz].tolist())))
            if key not in out:
                out[key] = (prob.cost_one(prob.effective(j, counts)[0]), counts)

        # Representatives of each class (first node), for single-node placements.
        reps = {}
        for n in range(prob.M):
            reps.setdefault(int(ids[n]), n)
        multi_nodes = np.flatnonzero((fits >= 1) & ~hosted)
        groups: Dict[int, List[int]] = {}
        for n in multi_nodes.tolist():
            groups.setdefault(int(ids[n]), []).append(n)
        group_list = list(groups.values())
        for i in self.cands[j].tolist():
            k = int(opts.k[i])
            if k > upper:
                break
            if opts.keep[i]:
                if state.keep_fits(j):
                    add(prob.base[j].copy())
                continue
            counts = np.zeros(prob.M, np.int64)
            if k == 0:
                add(counts)
                continue
            for n in reps.values():
                if fits[n] >= k:
                    counts = np.zeros(prob.M, np.int64)
                    counts[n] = k
                    add(counts)
            # Multi-node splits: per class, a non-increasing tuple of per-node counts.
            if int(fits[multi_nodes].sum()) < k or multi_nodes.size < 2:
                continue
            caps = [int(fits[g[0]]) for g in group_list]
            room = np.cumsum([len(g) * c for g, c in zip(group_list, caps)][::-1])[::-1]
            room = np.append(room, 0).tolist()     # room[gi]: capacity of groups gi..
            budget = {"visits": 0, "produced": 0}

            def rec(gi: int, left: int, used: int, counts: np.ndarray) -> None:
                nonlocal exhaustive
                budget["visits"] += 1
                if budget["visits"] > 4000 or budget["produced"] >= 64:
                    exhaustive = False
                    return
                if left == 0:
                    if used >= 2:
                        budget["produced"] += 1
                        add(counts.copy())
                    return
                if gi == len(group_list) or room[gi] < left:
                    return
                members, cap_n = group_list[gi], caps[gi]

                def fill(mi: int, hi: int, left2: int, used2: int) -> None:
                    # Members mi.. of this group take at most hi each (non-increasing).
                    if (len(members) - mi) * hi + room[gi + 1] < left2:
                        return
                    for c in range(min(hi, left2), 0, -1):
                        counts[members[mi]] = c
                        if mi + 1 < len(members) and left2 > c:
                            fill(mi + 1, c, left2 - c, used2 + 1)
                        else:
                            rec(gi + 1, left2 - c, used2 + 1, counts)
                        counts[members[mi]] = 0
                        if not exhaustive:
                            return
                    rec(gi + 1, left2, used2, counts)      # the rest of this group unused

                fill(0, cap_n, left, used)

            rec(0, k, 0, np.zeros(prob.M, np.int64))
        return sorted(out.values(), key=lambda t: _Key(t[0])), exhaustive

    def _branch_and_bound(self, incumbent: _State, bound: Tuple[float, float],
                          deadline: float) -> Tuple[_State, bool]:
        """Depth-first branch and bound over jobs' placements, pruned by DP suffix bounds.

        Returns the best state found and whether the search completed (then it is optimal).
        """
        prob = self.prob
        order = sorted(self.movable, key=lambda j: (-int(incumbent.counts[j].sum()),
                                                    prob.jobs[j].creation_timestamp, j))
        T = len(order)
        inc = incumbent.objective()
        if abs(inc[0] - bound[0]) < 0.5:
            # Any better solution idles no more jobs than the relaxation: the suffix DPs may
            # forbid idling runnable jobs and drop options that cannot beat the incumbent.
            ws, zs, gs, _, thinned, _ = self._dp_inputs(order[::-1], self.weights, fast=True,
                                                        ub=inc[1] - self.pinned_cost[1])
        else:
            ws, zs, gs, _, thinned, _ = self._dp_inputs(order[::-1], self.weights, fast=False)
        if thinned:
            return incumbent, False
        tables: List[Tuple[np.ndarray, np.ndarray]] = []
        _knapsack(ws, zs, gs, self.cap, tables)
        n_states = tables[0][0].size if tables else 1
        # suffix[t]: best relaxation cost of jobs order[t:] given capacity state.
        suffix = [tables[T - 1 - t] for t in range(T)] + [(np.zeros(n_states),) * 2]
        static_cls = [(bool(prob.eligible[:, n].all()),) + tuple(prob.base[:, n].tolist())
                      for n in range(prob.M)]
        best_obj = incumbent.objective()
        best_counts = incumbent.counts.copy()
        state = _State(prob)
        stats = {"nodes": 0, "aborted": False, "exhaustive": True}

        def dfs(t: int, acc: Tuple[float, float]) -> None:
            nonlocal best_obj, best_counts
            stats["nodes"] += 1
            if stats["nodes"] > self.max_bnb_nodes or (
                    stats["nodes"] % 64 == 0 and time.perf_counter() > deadline):
                stats["aborted"] = True
                return
            idx = self._cap_index(state.free)
            bound = (acc[0] + suffix[t][0][idx], acc[1] + suffix[t][1][idx])
            if not _better(bound, best_obj):
                return
            if t == T:
                best_obj, best_counts = state.objective(), state.counts.copy()
                return
            j = order[t]
            placements, exhaustive = self._placements(j, state, static_cls)
            if not exhaustive:
                stats["exhaustive"] = False
            for cost, counts in placements:
                state.add(j, counts)
                dfs(t + 1, (acc[0] + cost[0], acc[1] + cost[1]))
                state.remove(j)
                if stats["aborted"]:
                    return

        dfs(0, self.pinned_cost)
        self.details.update(bnb_nodes=stats["nodes"], bnb_complete=not stats["aborted"])
        out = _State(prob)
        for j in self.movable:
            if best_counts[j].any():
                out.add(j, best_counts[j])
        return out, not stats["aborted"] and stats["exhaustive"]
