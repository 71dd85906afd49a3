"""The default mode's budgeted search: round 0 (seeds, configs compiled already, new configs
chosen by structure), local search by one-step moves, successive halving, and the guesses
queued for the compile workers (see search.py's docstring for the whole mode).

In-container module: stdlib + torch (+ triton through the backend).

Split from search.py: `DefaultSearch` is mixed into `Tuner` (search.py),
whose attributes and candidate steps (candidates.py) and final (final_pick.py) it uses.
"""

from __future__ import annotations

import math
from typing import Any

from cellbench.tune import spaces
from cellbench.tune.search_types import Entry

__all__ = ["DefaultSearch", "is_far"]


def is_far(m: int, prev: int | None, near_log2: float) -> bool:
    """Whether batch size m searches on its own in default mode: nothing was tuned before it
    (prev None), or prev lies more than near_log2 doublings away (log2(M) distance)."""
    return prev is None or abs(math.log2(m / prev)) > near_log2


class DefaultSearch:
    """Tile structure, moves, seeds and the default mode's rounds (mixed into `search.Tuner`)."""

    @staticmethod
    def _tile(cfg: dict[str, int]) -> tuple[int, ...]:
        """The block shape and warp count: what matters most; GROUP_M and stages refine it."""
        return (cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"], cfg["num_warps"])

    # -- structure ----------------------------------------------------------------------------
    def _bm_target(self, m: int) -> int:
        """Rows an expert gets on average (M x top-k / E), as a power of two in [16, 128]."""
        sh = getattr(self.backend, "shape", None)
        topk = int(getattr(sh, "topk", 1) or 1)
        e = int(getattr(sh, "num_experts", 1) or 1)
        rows = max(1, math.ceil(m * topk / e))
        return min(max(16, 1 << (rows - 1).bit_length()), 128)

    def _warps_for(self, cfg: dict[str, int], choices: list[int]) -> int:
        """Warps that keep the fp32 accumulator at 32-128 values per thread (fewer is cheaper)."""
        area = cfg["BLOCK_SIZE_M"] * cfg["BLOCK_SIZE_N"]
        lanes = 64 if self.limits.platform == "rocm" else 32
        ok = [w for w in sorted(choices) if area // (lanes * w) <= 128]
        return ok[0] if ok else max(choices)

    def _structured(
        self, m: int, cands: list[tuple[str, dict[str, int]]], anchors: list[dict[str, int]]
    ) -> list[tuple[str, dict[str, int]]]:
        """Candidates in structural order: one representative per (BM, BN, BK, warps) tile with
        the stages that fit shared memory comfortably and a GROUP_M suited to M, tiles ranked
        by how close BM is to the rows an expert gets and BN/BK to the anchors' (the seeds),
        the warp count sized for the tile first."""
        if not cands:
            return []
        vals: dict[str, list[int]] = {}
        for _, c in cands:
            for kk, v in c.items():
                vals.setdefault(kk, [])
                if v not in vals[kk]:
                    vals[kk].append(v)
        bm_t = self._bm_target(m)
        smem = self.limits.smem_bytes
        group_pref = 1 if m <= 256 else 16
        by_tile: dict[tuple[int, ...], list[tuple[str, dict[str, int]]]] = {}
        for kc in cands:
            by_tile.setdefault(self._tile(kc[1]), []).append(kc)

        def rep(members: list[tuple[str, dict[str, int]]]) -> tuple[str, dict[str, int]]:
            def cost(kc: tuple[str, dict[str, int]]) -> tuple[float, ...]:
                c = kc[1]
                need = spaces.smem_lower_bound(c, self.operand_bytes)
                fits = smem is None or need <= 0.6 * smem
                st = c.get("num_stages", 2)
                return (
                    0 if fits else 1,
                    abs(st - 4) if smem is not None else 0,
                    0 if c["GROUP_SIZE_M"] == group_pref else 1,
                    abs(c.get("waves_per_eu", 0)),
                )

            return min(members, key=cost)

        def lg(a: int, b: int) -> float:
            return abs(math.log2(a) - math.log2(b))

        def score(tile: tuple[int, ...]) -> tuple[float, ...]:
            bm, bn, bk, w = tile
            cfg = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn}
            d = lg(bm, bm_t)
            if anchors:
                d += 0.5 * min(
                    lg(bn, a["BLOCK_SIZE_N"]) + lg(bk, a["BLOCK_SIZE_K"]) for a in anchors
                )
            warps_off = 0 if w == self._warps_for(cfg, vals["num_warps"]) else 1
            return (warps_off, d, -bk, bn)

        tiles = sorted(by_tile, key=score)
        return [rep(by_tile[t]) for t in tiles]

    def _neighbours(
        self, cfg: dict[str, int], by_key: dict[str, dict[str, int]]
    ) -> list[tuple[str, dict[str, int]]]:
        """Configs one step from cfg, nearest steps of every kind first (round robin): stages
        +-1, warps x2 or /2, BK, BN or BM x2 or /2, another GROUP_M, then BN or BM and warps
        doubled or halved together (the same accumulator per thread: a wider tile that one
        key alone reaches only through a slower config), then stages +-2."""
        st = cfg.get("num_stages", 2)
        w = cfg["num_warps"]
        kinds: list[list[dict[str, int]]] = [
            [{"num_stages": st + 1}, {"num_stages": st - 1}],
            [{"num_warps": w * 2}, {"num_warps": w // 2}],
        ]
        for kk in ("BLOCK_SIZE_K", "BLOCK_SIZE_N", "BLOCK_SIZE_M"):
            kinds.append([{kk: cfg[kk] * 2}, {kk: cfg[kk] // 2}])
        kinds.append([{"GROUP_SIZE_M": g} for g in (1, 16, 32, 64, 4, 8)])
        for kk in ("BLOCK_SIZE_N", "BLOCK_SIZE_M"):
            kinds.append([{kk: cfg[kk] * 2, "num_warps": w * 2},
                          {kk: cfg[kk] // 2, "num_warps": w // 2}])  # fmt: skip
        kinds.append([{"num_stages": st + 2}, {"num_stages": st - 2}])
        out: list[tuple[str, dict[str, int]]] = []
        seen = {spaces.config_key(cfg)}
        for i in range(max(len(k) for k in kinds)):
            for kind in kinds:
                if i >= len(kind):
                    continue
                key = spaces.config_key({**cfg, **kind[i]})
                if key in by_key and key not in seen:
                    seen.add(key)
                    out.append((key, by_key[key]))
        return out

    # -- neighbours ---------------------------------------------------------------------------
    def _far(self, m: int) -> bool:
        """Whether batch size m searches on its own: nothing was tuned before it in this run,
        or the size tuned before it lies more than `near_log2` doublings below. What that size
        found suits another number of rows per expert: with only 1, 16 and 4096 listed (fp8,
        one H100), M=4096 started from M=16's tiles within the later compile budget and kept
        vLLM's config, 1.078x exhaustive's pick, where the listed 1536 had led it to the best."""
        return is_far(m, self.prev_of.get(m), self.opt.near_log2)

    def _prior_keys(self, m: int) -> list[str]:
        """The size-class prior of batch size m: the seed table's entry vLLM would take at m
        (nearest in M), then, for a batch size searching on its own, the other entries within
        `near_log2` doublings of the nearest one's distance, nearest in log2(M) first (a
        table's small-M tiles never seed a large M), `prior_seeds` distinct configs at most."""
        table = self.opt.seed_table
        if not table:
            return []
        order = [min(table, key=lambda k: (abs(k - m), k))]
        if self._far(m):

            def dist(k: int) -> float:
                return abs(math.log2(k / m))

            reach = min(map(dist, table)) + self.opt.near_log2
            order += sorted((k for k in table if dist(k) <= reach), key=lambda k: (dist(k), k))
        keys: list[str] = []
        for k in order:
            key = spaces.config_key(table[k])
            if key not in keys:
                keys.append(key)
        return keys[: self.opt.prior_seeds if self._far(m) else 1]

    def _seed_configs(
        self, m: int, by_key: dict[str, dict[str, int]], finalist_keys: list[str]
    ) -> list[tuple[str, dict[str, int]]]:
        """Warm-start seeds: the previous batch size's finalists (its pick alone where m is
        far from it), then the size-class prior (`_prior_keys`) where those configs survive
        pruning."""
        keys = list(finalist_keys[: 1 if self._far(m) else self.opt.warm_start])
        keys += self._prior_keys(m)
        out, seen = [], set()
        for k in keys:
            if k in by_key and k not in seen:
                out.append((k, by_key[k]))
                seen.add(k)
        return out

    def _table_key(self, m: int) -> str | None:
        table = self.opt.seed_table
        if not table:
            return None
        return spaces.config_key(table[min(table, key=lambda k: (abs(k - m), k))])

    def _default_search(
        self, m: int, cands: list[tuple[str, dict[str, int]]], problems: list[Any], ref: Any
    ) -> Entry:
        """Budgeted search: seeds + the best already-compiled configs + structurally chosen new
        ones (round 0, few repeats), then local search around the best two (one key changed at
        a time) while the batch size's compile budget lasts, successive halving, and a
        side-by-side final that always includes the seed table's config."""
        budget = self._compile_budget(m)
        by_key = dict(cands)
        chosen, seeds = self._round0(m, cands, self.finalists_prev, self.ranked_prev)
        taken = {k for k, _ in chosen}
        reps = self.opt.halving_repeats
        ranked = self._screen(
            m, chosen, problems, ref, "halving-0", reps[0], True,
            queue_behind=lambda: self._prefetch_moves(m, chosen, seeds, by_key),
        )  # fmt: skip
        if not ranked:
            raise RuntimeError(self._nothing_left(m))
        # a first guess at the next batch size's round 0, from round 0's ranking: the workers
        # take it only when idle (see CompilePool), and the guess after the local search
        # below adds what changed
        ranked_keys = [r[2] for r in ranked]
        self._prefetch_next(m, ranked_keys[: self.opt.finalists], ranked_keys)
        tried = set(taken)
        extra_n = 0
        # local search: one-step moves from the best two, new compiles within the budget
        for _ in range(self.opt.local_rounds):
            best_before = ranked[0][0]
            moves: list[tuple[str, dict[str, int]]] = []
            for r in ranked[:2]:
                for k, c in self._neighbours(r[3], by_key):
                    if k in tried or k in self.failed or any(k == x for x, _ in moves):
                        continue
                    is_new = not self._is_compiled(m, k)
                    if is_new and budget is not None:
                        if (
                            self._new_at(m)
                            + sum(1 for x, _ in moves if not self._is_compiled(m, x))
                            >= budget
                        ):
                            continue
                    moves.append((k, c))
            moves = moves[: self.opt.moves_per_round]
            if not moves:
                break
            tried.update(k for k, _ in moves)
            extra_n += len(moves)
            ranked += self._screen(m, moves, problems, ref, "refine", reps[0], True)
            ranked.sort(key=lambda r: (r[0], r[1]))
            if ranked[0][0] >= best_before:
                break
        alive = [(r[2], r[3]) for r in ranked]
        round0 = [k for k, _ in alive]
        # from here on only compiled kernels are timed: the workers can start on the next M
        self._prefetch_next(m, round0, round0)
        for rnd, n_rep in enumerate(reps[1:], start=1):
            keep = max(self.opt.finalists, math.ceil(len(alive) / self.opt.eta))
            alive = alive[:keep]
            if len(alive) <= self.opt.finalists:
                break
            ranked = self._screen(m, alive, problems, ref, f"halving-{rnd}", n_rep, False)
            alive = [(r[2], r[3]) for r in ranked]
        finalists = alive[: self.opt.finalists]
        tk = self._table_key(m)  # the shipped config stands beside the finalists
        if tk is not None and tk in tried and tk not in self.failed:
            if all(k != tk for k, _ in finalists):
                finalists.append((tk, by_key[tk]))
        entry = self._final(m, finalists, problems, len(chosen) + extra_n)
        # next batch size starts from these (the pick first)
        self.finalists_prev = [spaces.config_key(entry.config)] + [
            k for k, _ in finalists if k != spaces.config_key(entry.config)
        ]
        head = [k for k, _ in alive]
        self.ranked_prev = head + [k for k in round0 if k not in set(head)]
        return entry

    def _round0(
        self,
        m: int,
        cands: list[tuple[str, dict[str, int]]],
        finalist_keys: list[str],
        ranked_keys: list[str],
    ) -> tuple[list[tuple[str, dict[str, int]]], list[tuple[str, dict[str, int]]]]:
        """Round 0 at m: the seeds (finalist_keys of the previous batch size, the seed table's
        nearest entry), the best-ranked configs already compiled, then new configs in
        structural order up to the exploring part of the compile budget. Returns (round 0,
        seeds)."""
        budget = self._compile_budget(m)
        by_key = dict(cands)
        seeds = self._seed_configs(m, by_key, finalist_keys)
        anchors = [c for _, c in seeds]
        if self._far(m):  # tiles shaped like the prior's, not like the far size's
            prior = set(self._prior_keys(m))
            anchors = [c for k, c in seeds if k in prior]
            ranked_keys = []
        chosen: list[tuple[str, dict[str, int]]] = list(seeds)
        taken = {k for k, _ in chosen}
        # configs compiled at earlier batch sizes that ranked well there cost no compile
        free = [
            (k, by_key[k])
            for k in ranked_keys
            if k in by_key and k not in taken and self._is_compiled(m, k)
        ][: self.opt.reuse_ranked]
        chosen += free
        taken.update(k for k, _ in free)
        new_used = sum(1 for k, _ in chosen if not self._is_compiled(m, k))
        explore_cap = None
        if budget is not None:
            reserve = max(budget // 3, 1)  # kept for the local search
            explore_cap = max(budget - reserve, 0)
        for k, c in self._structured(m, cands, anchors):
            if k in taken:
                continue
            if self.opt.max_configs and len(chosen) >= self.opt.max_configs:
                break
            if len(chosen) >= self.opt.round0_max:
                break
            is_new = not self._is_compiled(m, k)
            if is_new and explore_cap is not None and new_used >= explore_cap:
                continue
            chosen.append((k, c))
            taken.add(k)
            new_used += is_new
        if self.opt.max_configs:
            chosen = chosen[: max(self.opt.max_configs, len(seeds))]
        return chosen, seeds

    def _prefetch_next(self, m: int, finalist_keys: list[str], ranked_keys: list[str]) -> None:
        """Queue, as guesses, what round 0 of the next batch size will most likely compile,
        from m's current leaders (called after m's round 0 and again after its local
        search): the workers take them when idle, e.g. while m re-times compiled kernels
        only (halving, final), and would otherwise wait for that batch size to start. A
        guess that turns out wrong costs CPU only (counted), never GPU time or budget."""
        nxt = self.next_m.get(m)
        if self.pool is None or nxt is None or self.opt.mode != "default":
            return
        self.prev_of.setdefault(nxt, m)
        cands = self._candidates(nxt, quiet=True)
        chosen, _ = self._round0(nxt, cands, finalist_keys, ranked_keys)
        guess = [c for k, c in chosen if not self._is_compiled(nxt, k)]
        self.pool.prefetch(nxt, guess, speculative=True)

    def _prefetch_moves(
        self,
        m: int,
        chosen: list[tuple[str, dict[str, int]]],
        seeds: list[tuple[str, dict[str, int]]],
        by_key: dict[str, dict[str, int]],
    ) -> None:
        """Queue (behind round 0's kernels) the seeds' one-step neighbours: the warm-start seeds
        usually rank first, so these are the local search's likely moves, and the workers,
        idle while the GPU times round 0, have them ready when it asks. A speculative kernel
        the search never times costs CPU (counted in the pool's CPU seconds) but neither GPU
        time nor a place in the compile budget."""
        assert self.pool is not None
        guess: list[dict[str, int]] = []
        keys = {k for k, _ in chosen}
        for _, cfg in (seeds or chosen)[:2]:
            for k, c in self._neighbours(cfg, by_key):
                if k not in keys and k not in self.failed and not self._is_compiled(m, k):
                    keys.add(k)
                    guess.append(c)
        self.pool.prefetch(m, guess[: 2 * self.opt.moves_per_round], speculative=True)
