"""Step 3a of a round: local search on the true objective.

Used when the packed DP solution misses the DP bound (fragmentation, interference, mixed
requests). Starting from the best of several packings, it repeats three kinds of moves
while one strictly improves the objective, within ``max_search_evals`` evaluated
placements (and the optional deadline): re-pack two nodes so that split jobs fit on one
(slot case); re-place one job (grow into free room, consolidate, shrink); re-place a
receiver and a donor jointly. A heuristic: its result is certified optimal only when it
reaches the DP bound (where it stops early).
"""

from __future__ import annotations

import math
import time
from typing import Dict, Optional, Tuple

import numpy as np

from .fitness import _better
from .placement import _Packer, _State
from .problem import _FIT_EPS


class _LocalSearch(_Packer):
    """Improvement moves on a complete placement."""

    max_search_evals: int                   # budget on ``evals`` (set by the solver)
    target: Dict[int, float]                # each job's speedup in the DP's choice
    bound: Optional[Tuple[float, float]]    # the DP bound when exact, else None

    def _joint_response(self, j: int, i: int, state: _State) -> Tuple[np.ndarray, np.ndarray]:
        """Best pair of placements for jobs ``j`` and ``i`` (both absent from ``state``):
        each option of ``j`` followed by the best response of ``i``."""
        best_cost: Tuple[float, float] = (math.inf, math.inf)
        best = (np.zeros(self.prob.M, np.int64), np.zeros(self.prob.M, np.int64))
        for (zj, gj), cj in self._candidate_placements(j, state):
            state.add(j, cj)
            (zi, gi), ci = self._best_response(i, state)
            state.remove(j)
            total = (zj + zi, gj + gi)
            if _better(total, best_cost):
                best_cost, best = total, (cj, ci)
        return best

    def _repack_pair(self, state: _State, n1: int, n2: int) -> bool:
        """Re-pack the jobs living only on nodes ``n1`` and ``n2`` so that each sits on one
        node (slot case): a 0/1 knapsack on ``n1``'s free slots, fewest moves first.

        Fixes what best-fit packing cannot see, e.g. free slots 6 + 7 with items
        3, 2, 2, 2, 2, 2: best fit puts the 3 into the 6 and must split a 2. Keeps the
        result only if the objective improves.
        """
        prob = self.prob
        self.evals += 1
        mov = np.asarray(self.movable)
        counts = state.counts[mov]
        total = counts.sum(axis=1)
        inside = counts[:, n1] + counts[:, n2]
        items = mov[(total > 0) & (inside == total)].tolist()
        if len(items) < 2 or len(items) > 32:
            return False
        before = state.objective()
        old = {j: (state.counts[j].copy(), state.s_opt[j]) for j in items}
        for j in items:
            state.remove(j)
        q = self.slot_q
        nz = q > 0
        f1, f2 = (int(np.floor(np.min(state.free[n, nz] / q[nz]) + _FIT_EPS)) for n in (n1, n2))
        sizes = [int(old[j][0].sum()) for j in items]
        # dp[u]: fewest items moved away from their majority node with u slots used on n1.
        INF = 10 ** 9
        dp = np.full(f1 + 1, INF)
        dp[0] = 0
        take = np.zeros((len(items), f1 + 1), dtype=bool)
        for t, (j, k) in enumerate(zip(items, sizes)):
            on1 = old[j][0][n1] * 2 >= k
            stay2 = dp + (1 if on1 else 0)                 # item goes to n2
            go1 = np.full(f1 + 1, INF)
            if k <= f1:
                go1[k:] = dp[:f1 + 1 - k] + (0 if on1 else 1)
            take[t] = go1 < stay2
            dp = np.minimum(stay2, go1)
        total = sum(sizes)
        feasible = [u for u in range(f1 + 1) if dp[u] < INF and total - u <= f2]
        ok = False
        if feasible:
            u = min(feasible, key=lambda u: (dp[u], u))
            placement = {}
            for t in range(len(items) - 1, -1, -1):
                if take[t, u]:
                    placement[items[t]] = n1
                    u -= sizes[t]
                else:
                    placement[items[t]] = n2
            for j, k in zip(items, sizes):
                counts = np.zeros(prob.M, np.int64)
                counts[placement[j]] = k
                state.add(j, counts)
            self.evals += len(items)
            if _better(state.objective(), before):
                ok = True
            else:
                for j in items:
                    state.remove(j)
        if not ok:
            for j in items:
                state.add(j, old[j][0], old[j][1])
        return ok

    def _local_search(self, state: _State, deadline: float) -> _State:
        prob = self.prob
        movable = self.movable

        def out_of_budget() -> bool:
            return self.evals >= self.max_search_evals or time.perf_counter() > deadline

        improved = True
        while improved and not out_of_budget():
            improved = False
            if self.bound is not None and not _better(self.bound, state.objective()):
                break                                   # provably optimal already
            # Move 1 (slot case): re-pack two nodes around jobs that fell short of their DP
            # target (split by fragmentation).
            if self.slot_q is not None:
                short = [j for j in movable
                         if state.s_opt[j] < self.target.get(j, 0.0) * (1 - 1e-9)]
                # A short job split over two nodes: re-pack those two. A short job on one
                # node: pair it with the nodes that still have room.
                q = self.slot_q
                nz = q > 0
                room = np.floor(np.min(state.free[:, nz] / q[nz], axis=1) + _FIT_EPS) >= 1
                pairs = []
                for j in short:
                    on = np.flatnonzero(state.counts[j]).tolist()
                    if len(on) == 2:
                        pairs.append((on[0], on[1]))
                    elif len(on) == 1:
                        pairs.extend((min(on[0], n2), max(on[0], n2))
                                     for n2 in np.flatnonzero(room).tolist() if n2 != on[0])
                for n1, n2 in dict.fromkeys(pairs):
                    if out_of_budget():
                        break
                    if self._repack_pair(state, n1, n2):
                        improved = True
                        break
            if improved:
                continue
            # Move 2: re-place one job (grow into free room, consolidate, shrink).
            for j in movable:
                if out_of_budget():
                    break
                before = state.objective()
                old = state.remove(j)
                old_s = prob.effective(j, old)[0]
                _, counts = self._best_response(j, state)
                state.add(j, counts)
                if _better(state.objective(), before):
                    improved = True
                else:
                    state.remove(j)
                    state.add(j, old, old_s)
            if improved:
                continue
            # Move 3: a receiver and a donor are re-placed together: every option of the
            # receiver, each followed by the donor's best response (a greedy receiver would
            # grab everything freed and starve the donor).
            # Receivers: first the jobs that fell short of their DP target (packing losses),
            # then any job that could do better; donors: first the jobs sharing its nodes.
            z_now, g_now = prob.cost(state.s_opt)
            z_best, g_best = prob.cost(np.array([self.options[j].s.max() for j in movable]))
            potential = (z_now[movable] - z_best) * 1e6 + (g_now[movable] - g_best)
            short = np.array([state.s_opt[j] < self.target.get(j, 0.0) * (1 - 1e-9)
                              for j in movable])
            order = np.lexsort((-potential, ~short))
            receivers = [movable[i] for i in order if short[i] or potential[i] > 0]
            for j in receivers:
                mine = state.counts[j] > 0
                donors = sorted((i for i in movable if i != j and state.counts[i].any()),
                                key=lambda i: (not np.any(state.counts[i][mine] > 0),
                                               -int(state.counts[i].sum()), i))
                for i in donors:
                    if out_of_budget():
                        break
                    before = state.objective()
                    old_i, old_j = state.remove(i), state.remove(j)
                    old_si = prob.effective(i, old_i)[0]
                    old_sj = prob.effective(j, old_j)[0]
                    cj, ci = self._joint_response(j, i, state)
                    state.add(j, cj)
                    state.add(i, ci)
                    if _better(state.objective(), before):
                        improved = True
                        break
                    state.remove(i)
                    state.remove(j)
                    state.add(i, old_i, old_si)
                    state.add(j, old_j, old_sj)
                if improved or out_of_budget():
                    break
        return state
