"""Step 1 of a round: the best replica count per job, by dynamic programming.

The objective is separable over jobs, so with each job's value at ``K`` replicas taken as
an upper bound over all its placements (its unpenalised base allocation, or the penalised
speedup at the fewest nodes ``N_min`` that can hold ``K`` replicas or at ``N_min + 1``), a
knapsack DP over jobs x capacity finds the best replica counts of that relaxation exactly.
When all movable jobs request the same per-replica resources ("slot" case, e.g. every
trial of a Tune experiment) capacity is counted in replica slots per node, which also
accounts for per-node rounding. With mixed requests the DP runs over aggregate capacity of
the (at most three) binding resource types; this relaxation ignores per-node
fragmentation. The bound is valid when more nodes than ``N_min + 1`` never beat both
``N_min`` and ``N_min + 1``: true for speedups non-increasing in the node count
(:class:`~.speedup.LinearSpeedup`) and for the Pollux goodput model, which depends on the
node count only through ``N == 1`` vs ``N > 1``.

Exact reductions keep the DP small: dominated options are pruned; for ``p <= 0`` a job
never takes more than the capacity left once the most jobs that can run have their
minimum; if every job can run, idling is not considered; and Lagrangian reduced-cost
fixing drops options that cannot appear in any solution as good as a known one. Only if
the DP still exceeds ``max_dp_cells`` is it made heuristic (a geometric subset of replica
counts, or coarser resource units with mixed requests); it then gives no bound.

:class:`_Relaxation` holds a round's option tables, capacity model and DP; the placement
and search stages build on it (see :mod:`.allocator`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .fitness import _KEEP_BONUS
from .problem import _FIT_EPS, _Problem


@dataclass
class _Options:
    """Candidate (replica count, kind) options of one movable job after pruning."""

    k: np.ndarray          # replica counts
    keep: np.ndarray       # True: the unchanged base allocation
    s: np.ndarray          # optimistic effective speedup (incl. penalty / keep bonus)
    n_min: np.ndarray      # fewest nodes that can hold k replicas (relaxation)
    spread: np.ndarray     # True: k replicas do better on 2 nodes than on 1


def _job_options(prob: _Problem, j: int, kcap: Optional[int] = None
                 ) -> Tuple[_Options, np.ndarray]:
    """All options of job ``j`` (unpruned, sorted by K then keep-first) and its fits.

    ``kcap`` bounds the replica count (see the solver's replica caps)."""
    fits = prob.fits0(j)
    total = int(fits.sum())
    kmin = int(prob.min_r[j])
    kmax = int(min(prob.max_r[j], total, kcap if kcap is not None else total))
    ks = np.arange(kmin, kmax + 1, dtype=np.int64) if kmax >= kmin else np.zeros(0, np.int64)
    cum = np.cumsum(np.sort(fits)[::-1])
    n_min = np.searchsorted(cum, ks, side="left").astype(np.int64) + 1
    # The optimistic value is the best of N_min and N_min + 1 nodes: exact for speedups
    # non-increasing in N, and for the Pollux model, where N matters only as N == 1 vs N > 1
    # (its fitted inter-node sync can beat intra-node sync at large K).
    n_alt = np.minimum(n_min + 1, np.minimum(ks, np.count_nonzero(fits)))
    if ks.size:
        both = prob.speedup(j, np.concatenate([n_min, n_alt]), np.concatenate([ks, ks]))
        s_min, s_alt = both[:ks.size], both[ks.size:]
    else:
        s_min = s_alt = np.zeros(0)
    spread = (s_alt > s_min) & (n_alt > n_min) & (n_min == 1)
    s_move = np.maximum(s_min, np.where(n_alt > n_min, s_alt, 0.0)) * prob.factor[j]
    k_list = [np.zeros(1, np.int64), ks]
    keep_list = [np.zeros(1, bool), np.zeros(ks.size, bool)]
    s_list = [np.zeros(1), s_move]
    n_list = [np.zeros(1, np.int64), n_min]
    spread_list = [np.zeros(1, bool), spread]
    kb = int(prob.base[j].sum())
    if (prob.base_known[j] and kmin <= kb <= prob.max_r[j]
            and (kcap is None or kb <= kcap) and np.all(prob.base[j] <= fits)):
        nb = int(np.count_nonzero(prob.base[j]))
        s_keep = float(prob.speedup(j, np.array([nb]), np.array([kb]))[0]) * (1 + _KEEP_BONUS)
        k_list.append(np.array([kb]))
        keep_list.append(np.array([True]))
        s_list.append(np.array([s_keep]))
        n_list.append(np.array([nb]))
        spread_list.append(np.zeros(1, bool))
    k = np.concatenate(k_list)
    keep = np.concatenate(keep_list)
    s = np.concatenate(s_list)
    n = np.concatenate(n_list)
    sp = np.concatenate(spread_list)
    order = np.lexsort((~keep, k))      # by K, keep option first at equal K
    return _Options(k[order], keep[order], s[order], n[order], sp[order]), fits


def _prune(opts: _Options, weight: np.ndarray, min_gain: float) -> np.ndarray:
    """Indices of options not dominated by a lighter (or equally heavy, earlier) option.

    An option survives only if its speedup beats every lighter option's by a relative
    ``min_gain``: taking capacity for (almost) nothing is never useful, and this is what
    keeps a flat speedup curve at its smallest replica count.
    """
    order = np.lexsort((~opts.keep, opts.k, weight))
    s = opts.s[order]
    prev_best = np.concatenate([[-1.0], np.maximum.accumulate(s)[:-1]])
    survive = (prev_best < 0) | (s > prev_best * (1.0 + min_gain))
    return order[survive]


def _knapsack(weights: List[np.ndarray], z: List[np.ndarray], g: List[np.ndarray],
              cap: np.ndarray, tables: Optional[List[Tuple[np.ndarray, np.ndarray]]] = None
              ) -> Tuple[List[int], Tuple[float, float]]:
    """Pick one option per job minimising the lexicographic sum (z, g) under ``cap``.

    ``weights[j]`` is ``(m_j, d)`` integer capacity use per option; option 0 of every job
    must weigh nothing (the job idles). States are all capacity vectors ``<= cap``
    (row-major flattened); ``dp[c]`` is the best cost using at most ``c``. Exact.
    Ties (within 1e-12 relative) go to the lower option index (lighter / fewer replicas),
    and since jobs are backtracked last-first, later jobs yield on exact ties.
    If ``tables`` is a list, ``(dz, dg)`` after each job is appended to it.
    """
    cap = np.asarray(cap, dtype=np.int64)
    d = cap.size
    shape = tuple(int(c) + 1 for c in cap)
    n_states = int(np.prod(shape)) if d else 1
    strides = np.array([int(np.prod(shape[i + 1:])) for i in range(d)], dtype=np.int64)
    coords = np.indices(shape).reshape(d, -1).T if d else np.zeros((1, 0), np.int64)
    rows = np.arange(n_states)
    dz = np.zeros(n_states)
    dg = np.zeros(n_states)
    choices: List[np.ndarray] = []
    shifts: List[np.ndarray] = []
    # When no job's idle flag depends on its option, the first part is a constant.
    use_z = any(np.ptp(zj) > 0 for zj in z if len(zj))
    for w, zj, gj in zip(weights, z, g):
        w = np.asarray(w, dtype=np.int64).reshape(len(zj), d)
        shift = w @ strides
        valid = np.all(coords[:, None, :] >= w[None, :, :], axis=2) if d else np.ones(
            (n_states, len(zj)), dtype=bool)
        src = np.where(valid, rows[:, None] - shift[None, :], 0)
        G = np.where(valid, dg[src] + gj[None, :], np.inf)
        if use_z:
            Z = np.where(valid, dz[src] + zj[None, :], np.inf)
            G = np.where(Z <= Z.min(axis=1, keepdims=True) + 0.5, G, np.inf)
        gmin = G.min(axis=1, keepdims=True)
        ch = np.argmax(G <= gmin + 1e-12 * np.maximum(np.abs(gmin), 1.0), axis=1)
        dz = Z[rows, ch] if use_z else dz + (zj[0] if len(zj) else 0.0)
        dg = G[rows, ch]
        choices.append(ch.astype(np.int32))
        shifts.append(shift)
        if tables is not None:
            tables.append((dz, dg))
    state = n_states - 1
    picked = [0] * len(weights)
    for j in range(len(weights) - 1, -1, -1):
        c = int(choices[j][state])
        picked[j] = c
        state -= int(shifts[j][c])
    return picked, (float(dz[-1]), float(dg[-1]))


class _Relaxation:
    """The DP relaxation of one round: per-job option tables, capacity model, exact
    reductions and the knapsack giving replica counts and a lower bound on the cost."""

    def __init__(self, prob: _Problem, min_gain: float, max_dp_cells: int) -> None:
        self.prob = prob
        self.min_gain = min_gain
        self.max_dp_cells = max_dp_cells
        self.movable = [j for j in range(prob.J) if not prob.pinned[j]]
        self.details: Dict[str, Any] = {}
        # Slot case: every movable job requests the same resources per replica.
        self.slot_q: Optional[np.ndarray] = None
        if self.movable:
            q = prob.req[self.movable[0]]
            if all(np.array_equal(prob.req[j], q) for j in self.movable):
                self.slot_q = q
        kcap = self._replica_caps()
        self.capped = bool(kcap)
        self.options: Dict[int, _Options] = {}
        # Candidate options (indices, by K, keep first) for packing and the searches.
        self.cands: Dict[int, np.ndarray] = {}
        for j in self.movable:
            opts, _ = _job_options(prob, j, kcap.get(j))
            self.options[j] = opts
            # An unchanged allocation needs its own nodes, so unlike in the relaxation it
            # cannot stand in for a move of the same size: prune moves among themselves.
            moves = np.flatnonzero(~opts.keep)
            sub = _Options(opts.k[moves], opts.keep[moves], opts.s[moves], opts.n_min[moves],
                           opts.spread[moves])
            idx = np.concatenate([moves[_prune(sub, sub.k, min_gain)], np.flatnonzero(opts.keep)])
            self.cands[j] = idx[np.lexsort((~opts.keep[idx], opts.k[idx]))]
        pinned = np.flatnonzero(prob.pinned)
        z, g = prob.cost(np.array([prob.effective(j, prob.base[j])[0] for j in pinned]))
        self.pinned_cost = (float(z.sum()), float(g.sum()))
        self._setup_relaxation()

    def _slot_counts(self) -> np.ndarray:
        q = self.slot_q
        nz = q > 0
        return np.floor(np.min(self.prob.free0[:, nz] / q[nz], axis=1) + _FIT_EPS).astype(np.int64)

    def _replica_caps(self) -> Dict[int, int]:
        """Upper bounds on each job's replicas in every optimum of the relaxation (p <= 0).

        The lexicographic objective runs as many jobs as possible, so at least ``R`` jobs
        run, ``R`` being how many jobs that surely can run (positive speedup at their
        minimum) fit together at their minimum sizes; a running job therefore leaves room
        for the ``R - 1`` smallest others. This shrinks the DP (and the speedup evaluations
        of a first round) a lot when jobs outnumber or match the slots. Only the slot case.
        """
        prob = self.prob
        if prob.p > 0 or self.slot_q is None or len(self.movable) < 2:
            return {}
        cap = int(self._slot_counts().sum())
        lows: Dict[int, int] = {}
        for j in self.movable:
            fits = prob.fits0(j)
            kmin = int(prob.min_r[j])
            if kmin > min(int(prob.max_r[j]), int(fits.sum())):
                continue
            cum = np.cumsum(np.sort(fits)[::-1])
            n_min = int(np.searchsorted(cum, kmin, side="left")) + 1
            if prob.speedup(j, np.array([n_min]), np.array([kmin]))[0] * prob.factor[j] > 0:
                lows[j] = kmin
        w = np.sort(np.array(list(lows.values()), dtype=np.int64))
        csum = np.cumsum(w)
        r = int(np.searchsorted(csum, cap, side="right"))     # jobs surely running
        if r < 2:
            return {}
        sum_r, sum_r1, w_r = int(csum[r - 1]), int(csum[r - 2]), int(w[r - 1])
        caps = {}
        for j in self.movable:
            others = sum_r - lows[j] if j in lows and lows[j] <= w_r else sum_r1
            caps[j] = max(cap - others, 0)
        return caps

    # -- the relaxation ------------------------------------------------------------------
    def _setup_relaxation(self) -> None:
        """Choose the DP's capacity model: replica slots (all movable jobs request the same
        resources) or aggregate units of the most binding resource types."""
        prob = self.prob
        self.slots: Optional[np.ndarray] = None
        self.dims: List[int] = []
        self.units: List[float] = []
        self.thinned = False
        if not self.movable:
            self.cap = np.zeros(0, np.int64)
            self.weights = {}
            self.mode = "none"
            self.n_states = 1
            return
        if self.slot_q is not None:
            self.slots = self._slot_counts()
            # Capacity no job can use is not worth DP states (a node may report 1e9 CPUs).
            usable = sum(int(self.options[j].k.max()) for j in self.movable)
            self.cap = np.array([min(int(self.slots.sum()), usable)], dtype=np.int64)
            self.weights = {j: self.options[j].k[:, None] for j in self.movable}
            self.mode = "slots"
        else:
            self._setup_mixed()
            self.mode = "aggregate[" + ",".join(prob.resource_names[r] for r in self.dims) + "]"
        self.n_states = int(np.prod(self.cap + 1)) if self.cap.size else 1
        self.details.update(mode=self.mode, dp_states=self.n_states, replica_caps=self.capped)

    def _setup_mixed(self) -> None:
        prob = self.prob
        used = [r for r in range(len(prob.resource_names))
                if any(prob.req[j, r] > 0 for j in self.movable)]
        units, caps, tight = {}, {}, {}
        for r in used:
            fr = [Fraction(float(prob.req[j, r])).limit_denominator(10 ** 6)
                  for j in self.movable if prob.req[j, r] > 0]
            den = 1
            for f in fr:
                den = den * f.denominator // math.gcd(den, f.denominator)
            num = 0
            for f in fr:
                num = math.gcd(num, f.numerator * (den // f.denominator))
            units[r] = num / den
            demand = sum(prob.req[j, r] * int(self.options[j].k.max()) for j in self.movable)
            # Capacity beyond what the jobs can use is not worth DP states.
            caps[r] = int(min(np.floor(prob.free0[:, r] / units[r] + _FIT_EPS).sum(),
                              math.ceil(demand / units[r] - _FIT_EPS)))
            tight[r] = demand / max(prob.free0[:, r].sum(), 1e-12)
        # Never-binding resources cost DP states for nothing: drop them (dropping a
        # constraint keeps the relaxation a valid bound), and keep at most the three most
        # binding ones.
        for r in sorted(used, key=lambda r: -tight[r])[:3]:
            if tight[r] > 1.0:
                self.dims.append(r)
                self.units.append(units[r])
        self.weights = {}
        for j in self.movable:
            per = np.array([int(round(prob.req[j, r] / units[r])) for r in self.dims],
                           dtype=np.int64)
            self.weights[j] = self.options[j].k[:, None] * per[None, :]
        self.cap = np.array([caps[r] for r in self.dims], dtype=np.int64)

    def _cap_index(self, free: np.ndarray) -> int:
        """Flat DP state index of the aggregate capacity left in ``free``."""
        if self.slot_q is not None:
            q = self.slot_q
            nz = q > 0
            left = np.floor(np.min(free[:, nz] / q[nz], axis=1) + _FIT_EPS)
            return int(min(np.maximum(left, 0).sum(), self.cap[0]))
        index = 0
        for r, unit, c in zip(self.dims, self.units, self.cap.tolist()):
            left = int(np.maximum(np.floor(free[:, r] / unit + _FIT_EPS), 0).sum())
            index = index * (c + 1) + min(left, c)
        return index

    def _dp_inputs(self, order: List[int], weights: Dict[int, np.ndarray],
                   fast: bool = True, ub: Optional[float] = None):
        """Per-job option weights and costs for the knapsack: pruned, reduced, thinned.

        * Pruning drops options no better than a lighter one (``min_gain``).
        * With ``fast`` and ``p <= 0``, if every job that can run fits at its lightest
          positive option, idling such a job is never optimal: those options are dropped,
          the idle count becomes a constant and the DP skips the lexicographic part.
        * With a constant idle count and one capacity dimension, Lagrangian reduced-cost
          fixing drops every option that cannot be part of a solution costing at most
          ``ub`` (default: the Lagrangian primal solution, which is feasible): exact.
        * Only if the work still exceeds ``max_dp_cells`` is each job's option list
          thinned to a geometric sample (then the DP is a heuristic; sets ``thinned``).
        """
        prob = self.prob
        idxs = [_prune(self.options[j], weights[j].sum(axis=1), self.min_gain) for j in order]
        with_idle = idxs
        if fast and prob.p <= 0:
            light = []
            for j, idx in zip(order, idxs):
                pos = idx[self.options[j].s[idx] > 0]
                if pos.size:
                    light.append(weights[j][pos].min(axis=0))
            if light and np.all(np.sum(light, axis=0) <= self.cap):
                idxs = [idx[self.options[j].s[idx] > 0] if np.any(self.options[j].s[idx] > 0)
                        else idx for j, idx in zip(order, idxs)]
        const_z = prob.p > 0 or all(
            np.ptp(prob.cost(self.options[j].s[idx])[0]) == 0 for j, idx in zip(order, idxs))
        if const_z and self.cap.size >= 1 and len(order) > 1:
            idxs = self._reduced_cost_fixing(order, weights, idxs, ub)
        thinned = False
        n_opts = sum(idx.size for idx in idxs)
        cap = self.cap
        if self.cap.size >= 2 and self.n_states * n_opts > self.max_dp_cells:
            # Several resource types: coarsen the largest dimensions (requests rounded up,
            # capacity down): every DP solution stays feasible, but it is no longer a bound.
            factor = np.ones(self.cap.size, dtype=np.int64)
            lightest = np.array([weights[j][idx].min(axis=0) for j, idx in zip(order, idxs)])

            def still_fits(f: np.ndarray) -> bool:
                # If idling was ruled out on the exact capacities, the rounded-up lightest
                # options must still fit together in the rounded-down capacity, or some
                # capacities would have no feasible choice at all.
                return idxs is with_idle or bool(
                    np.all((-(-lightest // f[None, :])).sum(axis=0) <= self.cap // f))

            # (Never below 16 units per resource, nor so coarse that the jobs that must run
            # no longer fit: the budget is then exceeded instead.)
            while (np.prod(self.cap // factor + 1) * n_opts > self.max_dp_cells
                   and np.max(self.cap // factor) > 16):
                coarser = factor.copy()
                coarser[int(np.argmax(self.cap // factor))] *= 2
                if not still_fits(coarser):
                    break
                factor = coarser
            cap = self.cap // factor
            weights = {j: -(-weights[j] // factor[None, :]) for j in order}
            thinned = True
            self.details["dp_coarsened_by"] = factor.tolist()
        if self.n_states * n_opts > self.max_dp_cells and self.cap.size == 1:
            thin_to = max(8, self.max_dp_cells // (self.n_states * max(len(order), 1)))
            for i, (j, idx) in enumerate(zip(order, idxs)):
                if idx.size > thin_to:
                    # Keep the lightest options, the unchanged allocation and a geometric
                    # sample of the rest.
                    pos = np.unique(np.concatenate([
                        np.arange(min(4, idx.size)),
                        np.round(np.geomspace(1, idx.size - 1, thin_to)).astype(np.int64),
                        np.flatnonzero(self.options[j].keep[idx])]))
                    idxs[i] = idx[pos]
                    thinned = True
        ws, zs, gs = [], [], []
        for j, idx in zip(order, idxs):
            z, g = prob.cost(self.options[j].s[idx])
            ws.append(weights[j][idx])
            zs.append(z)
            gs.append(g)
        self.details["dp_options"] = int(sum(idx.size for idx in idxs))
        return ws, zs, gs, idxs, thinned, cap

    def _reduced_cost_fixing(self, order: List[int], weights: Dict[int, np.ndarray],
                             idxs: List[np.ndarray], ub: Optional[float]) -> List[np.ndarray]:
        """Drop options that no solution of cost <= ``ub`` can use.

        For multipliers ``lam >= 0`` (one per capacity dimension) the Lagrangian bound is
        ``L = sum_j min_k (g_jk + lam . w_jk) - lam . C``; a solution using option ``k`` of
        job ``j`` costs at least ``L + rc_jk`` with ``rc_jk = g_jk + lam . w_jk - min_k(..)``,
        so options with ``L + rc_jk > ub`` are never in a solution that good. ``lam`` comes
        from bisection on the total weight (cyclic over dimensions when there are several);
        ``ub`` defaults to the best feasible Lagrangian primal solution seen. Exact.
        """
        prob = self.prob
        cap = self.cap.astype(np.float64)
        d = cap.size
        m = max(idx.size for idx in idxs)
        J = len(order)
        G = np.full((J, m), np.inf)
        W = np.zeros((J, m, d))
        for i, (j, idx) in enumerate(zip(order, idxs)):
            G[i, :idx.size] = prob.cost(self.options[j].s[idx])[1]
            W[i, :idx.size] = weights[j][idx]
        rows = np.arange(J)
        state = {"best_l": -math.inf, "lam": np.zeros(d), "primal": math.inf}

        def solve(lam: np.ndarray) -> np.ndarray:
            val = G + W @ lam
            pick = np.argmin(val, axis=1)
            usage = W[rows, pick].sum(axis=0)
            lval = float(val[rows, pick].sum() - lam @ cap)
            if lval > state["best_l"]:
                state["best_l"], state["lam"] = lval, lam.copy()
            if np.all(usage <= cap):
                state["primal"] = min(state["primal"], float(G[rows, pick].sum()))
            return usage

        lam = np.zeros(d)
        usage = solve(lam)
        for _ in range(4 if d > 1 else 1):
            for r in range(d):
                trial = lam.copy()
                trial[r] = 0.0
                if solve(trial)[r] <= cap[r]:
                    lam = trial
                    continue
                lo, hi = 0.0, max(lam[r], 1.0)
                while True:
                    trial[r] = hi
                    if solve(trial)[r] <= cap[r]:
                        break
                    lo, hi = hi, hi * 4.0
                    if hi > 1e18:
                        return idxs
                for _ in range(40):
                    trial[r] = 0.5 * (lo + hi)
                    if solve(trial)[r] <= cap[r]:
                        hi = trial[r]
                    else:
                        lo = trial[r]
                    if hi - lo <= 1e-12 * hi:
                        break
                lam[r] = hi
            usage = solve(lam)
            if np.all(usage <= cap):
                break
        best_l, lam_best, primal = state["best_l"], state["lam"], state["primal"]
        threshold = primal if ub is None else ub
        if not math.isfinite(threshold) or not math.isfinite(best_l):
            return idxs
        val = G + W @ lam_best
        rc = val - val.min(axis=1, keepdims=True)
        tol = 1e-9 * max(1.0, abs(threshold)) + 1e-12 * float(np.abs(G[np.isfinite(G)]).sum())
        keep = best_l + rc <= threshold + tol
        out = [idx[keep[i, :idx.size]] for i, idx in enumerate(idxs)]
        if any(o.size == 0 for o in out):        # numerical safety net; cannot happen
            return idxs
        self.details["lagrangian"] = {"lambda": lam_best.tolist(), "bound": best_l,
                                      "primal": primal}
        return out

    def _dp(self, weights: Dict[int, np.ndarray]
            ) -> Tuple[Dict[int, int], Tuple[float, float], bool]:
        """Best option per movable job under the relaxation: choices, bound, thinned?"""
        ws, zs, gs, idxs, thinned, cap = self._dp_inputs(self.movable, weights)
        picked, bound = _knapsack(ws, zs, gs, cap)
        choice = {j: int(idxs[i][picked[i]]) for i, j in enumerate(self.movable)}
        return choice, (bound[0] + self.pinned_cost[0], bound[1] + self.pinned_cost[1]), thinned
