"""Step 2 of a round: placing replicas on nodes.

:class:`_State` is a (partial) placement with its free capacity and the multi-node job
each node hosts; its :meth:`_State.place` puts ``K`` replicas of one job on a single node
when one fits (best fit), else on the fewest nodes not already hosting another multi-node
job. :class:`_Packer` packs the DP's replica counts with it: unchanged allocations first,
then the largest jobs; it also finds the best placement of one job given the others
(what the local search and the status-quo start are built from).
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from .fitness import _better
from .problem import _FIT_EPS, _Problem
from .replica_counts import _Relaxation


class _State:
    """A (partial) placement: replica counts per job and node, free capacity, multi-node
    host per node (interference)."""

    def __init__(self, prob: _Problem) -> None:
        self.prob = prob
        self.free = prob.free0.copy()
        self.counts = np.zeros((prob.J, prob.M), dtype=np.int64)
        self.host = np.full(prob.M, -1, dtype=np.int64)
        self.s_opt = np.zeros(prob.J)      # speedup as optimised (keep bonus included)
        for j in np.flatnonzero(prob.pinned):
            self.counts[j] = prob.base[j]
            if np.count_nonzero(prob.base[j]) > 1:
                nodes = np.flatnonzero(prob.base[j])
                self.host[nodes[self.host[nodes] < 0]] = j
            self.s_opt[j] = prob.effective(j, prob.base[j])[0]

    def copy(self) -> "_State":
        new = object.__new__(_State)
        new.prob = self.prob
        new.free = self.free.copy()
        new.counts = self.counts.copy()
        new.host = self.host.copy()
        new.s_opt = self.s_opt.copy()
        return new

    def add(self, j: int, counts: np.ndarray, s_opt: Optional[float] = None) -> None:
        self.counts[j] = counts
        self.free -= counts[:, None] * self.prob.req[j][None, :]
        np.maximum(self.free, 0.0, out=self.free, where=self.free > -1e-9)
        nodes = np.flatnonzero(counts)
        if nodes.size > 1:
            self.host[nodes] = j
        self.s_opt[j] = self.prob.effective(j, counts)[0] if s_opt is None else s_opt

    def remove(self, j: int) -> np.ndarray:
        old = self.counts[j].copy()
        self.free += old[:, None] * self.prob.req[j][None, :]
        self.host[self.host == j] = -1
        self.counts[j] = 0
        self.s_opt[j] = 0.0
        return old

    def objective(self) -> Tuple[float, float]:
        z, g = self.prob.cost(self.s_opt)
        return float(z.sum()), float(g.sum())

    def keep_fits(self, j: int) -> bool:
        """Whether job ``j``'s base allocation can be restored right now."""
        prob = self.prob
        base = prob.base[j]
        need = base[:, None] * prob.req[j][None, :]
        if np.any(need > self.free + _FIT_EPS * np.maximum(need, 1.0)):
            return False
        nodes = np.flatnonzero(base)
        return nodes.size <= 1 or bool(np.all(self.host[nodes] < 0))

    def place(self, j: int, k: int, fits: np.ndarray,
              spread: bool = False) -> Optional[np.ndarray]:
        """Counts per node for ``k`` replicas of job ``j``, or ``None`` if they do not fit.

        Single node when possible (best fit: least room left, then the job's old nodes);
        otherwise the fewest nodes without another multi-node job (largest first, the last
        one best fit). ``spread`` asks for at least two nodes (for a job whose model runs
        faster across nodes) and falls back to the default when that is impossible.
        """
        counts = np.zeros(self.prob.M, dtype=np.int64)
        if k <= 0:
            return counts
        base = self.prob.base[j]
        if spread and k >= 2:
            got = self._place_multi(k, fits, base, min_nodes=2)
            if got is not None:
                return got
        single = np.flatnonzero(fits >= k)
        if single.size:
            order = np.lexsort((single, -base[single], fits[single] - k))
            counts[single[order[0]]] = k
            return counts
        return self._place_multi(k, fits, base, min_nodes=2)

    def _place_multi(self, k: int, fits: np.ndarray, base: np.ndarray,
                     min_nodes: int) -> Optional[np.ndarray]:
        counts = np.zeros(self.prob.M, dtype=np.int64)
        cand = np.flatnonzero((fits >= 1) & (self.host < 0))
        f = fits[cand]
        if f.sum() < k or cand.size < min_nodes:
            return None
        order = np.lexsort((cand, -base[cand], -f))
        cand, f = cand[order], f[order]
        # Node i may take at most k - (min_nodes - 1 - i) so that later nodes get >= 1.
        take = f.copy()
        for i in range(min(min_nodes - 1, cand.size)):
            take[i] = min(take[i], k - (min_nodes - 1 - i))
        cum = np.cumsum(take)
        m = max(int(np.searchsorted(cum, k, side="left")) + 1, min_nodes)
        counts[cand[:m - 1]] = take[:m - 1]
        rem = k - int(cum[m - 2])
        rest = np.arange(m - 1, cand.size)
        ok = rest[f[rest] >= rem]
        if rem <= 0 or ok.size == 0:
            return None
        pick = ok[np.lexsort((cand[ok], -base[cand[ok]], f[ok] - rem))[0]]
        counts[cand[pick]] = rem
        return counts


class _Packer(_Relaxation):
    """Packing of the DP's choice and best placements of single jobs."""

    evals: int      # placements evaluated so far (set by the solver; budgets the search)

    def _pack(self, choice: Dict[int, int]) -> _State:
        prob = self.prob
        state = _State(prob)
        keeps = [j for j in self.movable if self.options[j].keep[choice[j]]]
        moves = [j for j in self.movable if not self.options[j].keep[choice[j]]]
        for j in keeps:
            if state.keep_fits(j):
                state.add(j, prob.base[j])
            else:
                moves.append(j)
        moves.sort(key=lambda j: (-int(self.options[j].k[choice[j]]),
                                  prob.jobs[j].creation_timestamp, j))
        for j in moves:
            k = int(self.options[j].k[choice[j]])
            counts = state.place(j, k, prob.fits(j, state.free),
                                 bool(self.options[j].spread[choice[j]]))
            if counts is None:
                # Fall back to the best smaller option that can be placed.
                _, counts = self._best_response(j, state, max_k=k - 1)
            state.add(j, counts)
        return state

    def _pack_minimums_first(self, choice: Dict[int, int]) -> _State:
        """Like :meth:`_pack`, but every job is first placed at its lightest useful option
        (oldest first) and only then grown toward ``choice`` (largest first) where room is
        left. With mixed requests the DP's aggregate capacities ignore how resource types
        couple on a node (CPU-only replicas can fill the CPUs of the nodes with free GPUs),
        and packing the large choices first can then leave jobs idle that could all run.
        """
        prob = self.prob
        state = _State(prob)
        for j in sorted(self.movable, key=lambda j: (prob.jobs[j].creation_timestamp, j)):
            opts = self.options[j]
            useful = [i for i in self.cands[j].tolist()
                      if opts.k[i] > 0 and opts.s[i] > 0 and not opts.keep[i]]
            if useful:
                counts = state.place(j, int(opts.k[useful[0]]), prob.fits(j, state.free))
                if counts is not None:
                    state.add(j, counts)
        for j in sorted(self.movable, key=lambda j: -int(self.options[j].k[choice[j]])):
            k = int(self.options[j].k[choice[j]])
            if k <= int(state.counts[j].sum()):
                continue
            state.remove(j)
            counts = state.place(j, k, prob.fits(j, state.free),
                                 bool(self.options[j].spread[choice[j]]))
            if counts is None:  # the best option up to k; the one just removed still fits
                counts = self._best_response(j, state, max_k=k)[1]
            state.add(j, counts)
        return state

    def _best_response(self, j: int, state: _State, max_k: Optional[int] = None
                       ) -> Tuple[Tuple[float, float], np.ndarray]:
        """Best placement of job ``j`` (absent from ``state``) over its options."""
        best_cost: Tuple[float, float] = (math.inf, math.inf)
        best_counts = np.zeros(self.prob.M, np.int64)
        for cost, counts in self._candidate_placements(j, state, max_k):
            if _better(cost, best_cost):
                best_cost, best_counts = cost, counts
        return best_cost, best_counts

    def _candidate_placements(self, j: int, state: _State, max_k: Optional[int] = None
                              ) -> Iterator[Tuple[Tuple[float, float], np.ndarray]]:
        """Placements of job ``j`` (absent from ``state``) to try, with their cost pairs.

        One per candidate option up to what the free room (and ``max_k``) allows: the
        unchanged allocation when it still fits, else one :meth:`_State.place` per replica
        count. Each one counts in ``evals``. The caller may change ``state`` between items
        if it restores it before asking for the next.
        """
        prob = self.prob
        opts = self.options[j]
        fits = prob.fits(j, state.free)
        upper = max(int(fits.max(initial=0)), int(fits[state.host < 0].sum()))
        if max_k is not None:
            upper = min(upper, max_k)
        seen_k = set()
        for i in self.cands[j].tolist():
            k = int(opts.k[i])
            if k > upper:
                break
            if opts.keep[i]:
                if not state.keep_fits(j):
                    continue
                counts = prob.base[j].copy()
            else:
                if k in seen_k:
                    continue
                seen_k.add(k)
                counts = state.place(j, k, fits, bool(opts.spread[i]))
                if counts is None:
                    continue
            self.evals += 1
            yield prob.cost_one(prob.effective(j, counts)[0]), counts
