"""One key of `sparse` with its peers: `kda`'s harness with MLA (and the DSA indexer) as its attention half.

A launch's input is H, every row's position (tokens cached before the step: rows at contexts below and above the
selection width in one launch) and the DSA caches (replicated on every rank). The caches a check starts from are
random (bf16 normal rows): a step reads them as they are, so their values need no prefill to prove its math;
`run` prefills them through the reference instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds.harness import Inputs, KindHarness, RunKey, Timed, cloned, layer_state, nbytes, row_contexts
from glm53ctl.kernels.kinds.kda.harness import KdaHarness
from glm53ctl.kernels.kinds.layer.launch import LayerLaunch
from glm53ctl.kernels.kinds.layer.table import STAGES
from glm53ctl.kernels.kinds.layer.weights import prepare_weights
from glm53ctl.kernels.kinds.run_key import layer_for
from glm53ctl.kernels.kinds.sparse.stock import stock_dsa
from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.dsa import tasks as dsa
from glm53ctl.kernels.ops.ffn.tasks import EXP_DOWN, EXP_GU, ROUTE, ROUTER
from glm53ctl.kernels.ops.gemv.tasks import OPROJ
from glm53ctl.kernels.ops.mhc.tasks import RED_F
from glm53ctl.kernels.reference import DecodeState, Reference, room
from glm53ctl.kernels.runtime.ranks import steps_on_ranks
from glm53ctl.kernels.state import DsaCache
from glm53ctl.kernels.weights import Weights

# the separate-launches baseline: the gates, MLA's steps, the reduces and FFN gates, the MoE
SPARSE_STAGES = STAGES[:2] + ((dsa.MLA_A,), (dsa.MLA_ROW,), (dsa.MLA_QB,), (dsa.ABSORB, dsa.SCORE))
SPARSE_STAGES += ((dsa.SEL_PASS, dsa.SELECT), (dsa.ATTN,), (dsa.COMBINE,), (dsa.WUV,), (OPROJ,))
SPARSE_STAGES += STAGES[5:7] + ((ROUTER,), (ROUTE,), (EXP_GU,), (EXP_DOWN,), (RED_F,))
CACHE_NAMES = ("latent", "index_key", "index_gate", "pooled_key")


@dataclass
class SparseInput:
    """A `sparse` launch's input: H [R, hc, D] bf16, pos [R] (tokens cached before the step) and the caches
    [R, slots, ...] bf16."""

    H: torch.Tensor
    pos: torch.Tensor
    cache: DsaCache

    def to(self, device) -> SparseInput:
        c = DsaCache(*(getattr(self.cache, n).to(device) for n in CACHE_NAMES))
        return SparseInput(self.H.to(device), self.pos.to(device), c)

    def clone_cache(self) -> DsaCache:
        return DsaCache(*(getattr(self.cache, n).clone() for n in CACHE_NAMES))


def check_contexts(spec, rows: int) -> list[int]:
    """Rows' contexts for a check: below the selection width (every pool attended) and above it (the top pools
    selected), at every pool phase, and one row completing a pool this step."""
    w = spec.index_width
    kp = spec.indexer.kpool
    pattern = [w // 3, 3 * w + 1, w - 1, 2 * w + kp - 2, 1, 4 * w + 2, w + 1, kp - 1]
    return pattern[:rows]


def rows_contexts(spec, key: ResolvedKey) -> list[int]:
    """The rows' contexts of a key: the check's pattern, or the key's context for every row (`row_contexts`)."""
    if key.context is None:
        return check_contexts(spec, key.rows)
    return row_contexts(key.context, key.rows, spec.indexer.kpool)


# the names of the caches' rows a launch wrote (`written_rows`), outputs beside the launch's own
WRITTEN = ("dsa.latent", "dsa.index_key", "dsa.index_gate", "dsa.pooled_key")


def written_rows(cache: DsaCache, pos: torch.Tensor, kpool: int) -> dict[str, torch.Tensor]:
    """The caches' rows a launch wrote: each row's at its position, the pooled key's at the pool it completes
    (or its last complete one)."""
    rows = torch.arange(pos.shape[0], device=pos.device)
    p = pos.long()
    pool = ((p + 1) // kpool - 1).clamp(min=0)
    at = (cache.latent[rows, p], cache.index_key[rows, p], cache.index_gate[rows, p], cache.pooled_key[rows, pool])
    return dict(zip(WRITTEN, at, strict=True))


class SparseHarness(KdaHarness):
    kind = "sparse"
    STAGES = SPARSE_STAGES
    Launch = LayerLaunch
    # -1 is the selection's padding: its poison is -2
    POISON_INT = {"dsa.idx": -2}
    FOLLOWED = ("moe.ids", "dsa.idx")

    def __init__(self, weights: Weights, key: ResolvedKey, layer=None, steps: int = 1) -> None:

        KindHarness.__init__(self, weights, key)
        spec, knobs, tp, rows, device = self.spec, self.knobs, self.tp, self.rows, self.device
        self.layer = layer_for(spec, self.kind, layer)
        self.contexts = rows_contexts(spec, key)
        self.slots = room(spec, max(self.contexts) + steps)
        src = weights.source_layer(self.layer)
        self.w = [
            weights.prepared(
                (src, r, tp, str(device), False, "moe", "mla"),
                lambda r=r: prepare_weights(weights.layer(self.layer, r, tp), spec, tp, device, False, "moe", "mla"),
            )
            for r in range(tp)
        ]
        mk = lambda **kw: LayerLaunch(spec, tp, rows, knobs, device, ffn="moe", attn="mla", slots=self.slots, **kw)  # noqa: E731
        self.launch = self.scheduled(mk())
        if tp > 1:
            self.attn = [mk(rank=q, mode="attn") for q in range(tp)]
            self.ffn = [mk(rank=q, mode="ffn") for q in range(1, tp)]

    @classmethod
    def build_launches(cls, spec, key: ResolvedKey, steps: int = 1) -> list[tuple[str, object]]:
        # the caches' capacity is a compile-time constant: a launch per capacity (whole pools past the context)
        longest = max(check_contexts(spec, key.rows)) if key.context is None else key.context
        slots = room(spec, longest + steps)
        tp, rows, knobs = key.tp, key.rows, key.knobs
        mk = lambda **kw: LayerLaunch(spec, tp, rows, knobs, "cpu", ffn="moe", attn="mla", slots=slots, **kw)  # noqa: E731
        peers = [(f"peer.{m}", mk(rank=1, mode=m)) for m in ("attn", "ffn")] if tp > 1 else []  # as dense's
        return cls.scheduled_builds(key, [("launch", mk())] + peers)

    def inputs(self, seed: int, steps: int = 1, tokens=None) -> list[SparseInput]:
        """Seeded H, the rows' positions and random caches per step."""
        gen = Inputs(self.spec, seed, FP32)
        m, ix, R = self.spec.mla, self.spec.indexer, self.rows
        out = []
        for _ in range(steps):
            H = gen.H(R).to(torch.bfloat16)
            r = lambda *s: (gen.rows_normal(*s) * 0.5).to(torch.bfloat16)  # noqa: E731
            L = self.slots
            cache = DsaCache(
                r(R, L, m.kv_lora_rank), r(R, L, ix.head_dim), r(R, L, ix.head_dim), r(R, L // ix.kpool, ix.head_dim)
            )
            out.append(SparseInput(H, torch.tensor(self.contexts), cache))
        return out

    def _run(self, launch, x: SparseInput, w, **guard) -> DsaCache:
        """One launch on a copy of the caches (the input stays as it was); the caches after it."""
        cache = x.clone_cache()
        launch(x.H, w, cache, x.pos.to(torch.int32), **guard)
        return cache

    def run_peer(self, launch, x: SparseInput, q: int) -> None:
        """One partial launch of rank q, on a copy of the replicated caches. (Its state writes are the caches,
        which every rank writes alike: `check` compares rank 0's.)"""
        self._run(launch, x, self.w[q])

    def __call__(self, x: SparseInput, peers=None, poison: bool = False, **guard) -> dict[str, torch.Tensor]:
        """One launch of rank 0 (after the peers' partials): every output, and the caches' rows at each row's
        position (the pooled key's at the pool it completes, or its last complete one)."""
        x, _, launch = self.ready(x, peers, poison)
        cache = self._run(launch, x, self.w[0], **guard)
        out = {n: t.clone() for n, t in launch.out.items()}
        self._last = (x.pos.cpu(), self._untouched(x.cache, cache, x.pos))
        self.cache_after = cache
        return out | self._written(cache, x.pos)

    def _written(self, cache: DsaCache, pos: torch.Tensor) -> dict[str, torch.Tensor]:
        return written_rows(cache, pos, self.spec.indexer.kpool)

    def reference(self, x: SparseInput) -> dict[str, torch.Tensor]:
        """The reference layer at this TP width on the launch's inputs: its outputs and its cache writes."""
        i = self.layer
        x = x.to(self.weights.device)  # where the reference's weights are
        c = DsaCache(*(getattr(x.cache, n).float() for n in CACHE_NAMES))
        state = DecodeState(x.pos.long(), self.slots, {}, {i: c})
        out, new = self.reference_model().layer(i, x.H.float(), state)
        return out | self._written(new.dsa[i], x.pos.long())

    def invariants(self, out: dict, ref: dict) -> dict[str, bool]:
        """The routing's (kda), and the selection's: the reference's tokens, every row's valid prefix strictly
        ascending and below its token count, -1 after it; and nothing written but each row's position (and the
        pool it completes)."""
        got = super().invariants(out, ref)
        idx = out["dsa.idx"].long().cpu()
        pos, untouched = self._last
        n = pos.long() + 1
        prefix_ok = True
        for r in range(self.rows):
            valid = idx[r][idx[r] >= 0]
            k = len(valid)
            prefix_ok &= bool((idx[r, k:] == -1).all()) and bool((valid < n[r]).all())
            prefix_ok &= bool((valid[1:] > valid[:-1]).all())
        return got | {
            "selection equals the reference's (near-ties followed)": torch.equal(idx, ref["dsa.idx"].long().cpu()),
            "selection ascending, in range, -1 padded": prefix_ok,
            "caches written at each row's position only": untouched,
        }

    @classmethod
    def run(cls, weights: Weights, key: RunKey, resolved: ResolvedKey) -> dict[str, torch.Tensor]:
        """`run --backend triton`: run_reference's inputs (the same draws: the caches prefilled to each row's
        context by the reference, then H per step) through the launch, each step's cache writes read by the
        next."""
        k = cls(weights, replace(resolved, context=key.context), layer=key.layer, steps=key.steps)
        xs = cls.step_inputs(weights, key, k.layer, k.contexts, k.slots)
        caches, pos = [xs[0].cache], xs[0].pos.clone()  # each step's caches before it, then the last's writes
        for step, x in enumerate(xs):
            out = {n: t for n, t in k(SparseInput(x.H, pos + step, caches[-1])).items() if n in k.launch.out}
            caches.append(DsaCache(*(getattr(k.cache_after, n).cpu() for n in CACHE_NAMES)))
        return cls.run_saved(k.layer, k.contexts, x.H, pos + len(xs) - 1, caches[-2], out, caches[-1])

    @classmethod
    def run_ranks(
        cls, weights: Weights, key: RunKey, resolved: ResolvedKey, source, rank_fn
    ) -> dict[str, torch.Tensor]:
        """`run --backend triton --gpus T`: `run`'s steps on T real ranks, each rank carrying its caches (every
        rank computes them) from step to step; what `run` saves (rank 0's caches), and every rank's outputs and
        caches as `ranks.<r>.*`."""

        resolved = replace(resolved, context=key.context)
        spec = weights.spec
        layer = layer_for(spec, cls.kind, key.layer)
        contexts = rows_contexts(spec, resolved)
        xs = cls.step_inputs(weights, key, layer, contexts, room(spec, max(contexts) + key.steps))
        out = steps_on_ranks(rank_fn, resolved, xs, source)

        def caches(step: int) -> DsaCache:
            return DsaCache(*(out[0][step][f"cache.{n}"] for n in CACHE_NAMES))

        before = caches(-2) if len(xs) > 1 else xs[0].cache
        names = cls.launch_outputs(out[0][-1])
        last = {n: t.clone() for n, t in out[0][-1].items() if n in names}
        saved = cls.run_saved(layer, contexts, xs[-1].H, xs[0].pos + len(xs) - 1, before, last, caches(-1))
        return saved | {f"ranks.{r}.{n}": t for r in range(resolved.tp) for n, t in out[r][-1].items()}

    @staticmethod
    def launch_outputs(got: dict) -> list[str]:
        """A rank's launch outputs, without the caches' rows and whole caches it also returns."""
        return [n for n in got if not n.startswith("cache.") and n not in WRITTEN]

    @classmethod
    def step_inputs(cls, weights: Weights, key: RunKey, layer: int, contexts, slots: int) -> list[SparseInput]:
        """A run's steps' inputs: H per step, with (the first's to read) the caches prefilled by the reference
        to each row's context and the rows' positions then."""
        inputs = Inputs(weights.spec, key.seed, FP32)
        st = layer_state(Reference(weights), layer, contexts, inputs, slots)
        cache = DsaCache(*(getattr(st.dsa[layer], n).to(torch.bfloat16) for n in CACHE_NAMES))
        return [SparseInput(inputs.H(key.rows).to(torch.bfloat16), st.pos.clone(), cache) for _ in range(key.steps)]

    @staticmethod
    def run_saved(layer: int, contexts, H, pos, before: DsaCache, out: dict, after: DsaCache) -> dict:
        """What `run` saves: the inputs of the last step (H, the positions, the caches before it), its outputs
        and the caches after it."""
        pre = f"layers.{layer}.dsa."
        return (
            {"inputs.contexts": torch.tensor(contexts), "inputs.H": H, "inputs.layer": torch.tensor(layer)}
            | {"inputs.pos": pos}
            | {f"inputs.state.{pre}{n}": getattr(before, n).float() for n in CACHE_NAMES}
            | {f"outputs.{n}": t.cpu() for n, t in out.items()}
            | {f"writes.{pre}{n}": getattr(after, n).float() for n in CACHE_NAMES}
        )

    def _untouched(self, before: DsaCache, after: DsaCache, pos: torch.Tensor) -> bool:
        """Whether the caches after a launch equal those before it everywhere but each row's position (and the
        pool a row completes)."""
        R = self.rows
        rows = torch.arange(R, device=pos.device)
        p = pos.long()
        done = (p + 1) % self.spec.indexer.kpool == 0
        ok = True
        for name in CACHE_NAMES:
            a, b = getattr(after, name), getattr(before, name)
            keep = torch.ones(a.shape[:2], dtype=torch.bool, device=a.device)
            if name == "pooled_key":
                keep[rows[done], ((p + 1) // self.spec.indexer.kpool - 1)[done]] = False
            else:
                keep[rows, p] = False
            ok &= torch.equal(a[keep], b[keep])
        return ok

    def timed(self, x: SparseInput, peers) -> Timed:
        """Rank 0's launch on copies of its weights: it moves every weight it reads (the experts the rows chose),
        the caches it reads (each row's pooled keys and the latent rows it selected) and writes, H, the peers'
        partials and its outputs."""
        x = x.to(self.device)
        launch = self.launch
        if peers is not None:
            launch.set_peers(peers.parts_a, peers.parts_f)
        cache = x.clone_cache()
        pos = x.pos.to(torch.int32)
        self(x, peers)
        spec, d = self.spec, launch.d
        w = self.w[0]
        untouched = spec.moe.experts - int(launch.buf["n_slots"][0])
        per_expert = sum(nbytes(w[n]) for n in ("w_eg", "w_eu", "w_ed")) // (spec.moe.experts + 1)
        weights = nbytes(*w.values()) - untouched * per_expert
        n = x.pos.long() + 1
        pools = int((n // d.KP).sum())
        selected = int((launch.buf["idx"] >= 0).sum())
        reads = pools * d.IH * 2 + selected * d.C * 2
        writes = self.rows * (d.C + 2 * d.IH) * 2 + int(((n % d.KP) == 0).sum()) * d.IH * 2
        moved = weights + reads + writes + nbytes(x.H) + nbytes(*launch.out.values())
        moved += 2 * (self.tp - 1) * self.rows * spec.hidden * 4
        call = lambda c: launch(x.H, c, cache, pos, check=False)  # noqa: E731
        return Timed(call, cloned(w), weights, moved, "rank 0's layer weights", launch.out["H"])

    def stock_attention(self, x: SparseInput):
        """The attention half of `stock`: MLA and the indexer in stock ops a CUDA graph captures
        (kinds/sparse/stock.py), on x's caches and positions."""

        cache, pos = x.clone_cache(), x.pos.long()
        return lambda xh, w, num: stock_dsa(xh, w, cache, pos, self.spec, num)
