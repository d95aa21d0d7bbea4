"""The `sparse` launch of one build key and rank: `dense`'s layer kernel with MLA as its attention half and the
MoE as its FFN (kinds/dense/table.py `_add_mla`, `_add_moe`), its own buffers, and the DSA caches it writes at
each row's position."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds.dense.launch import DenseLaunch
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS
from glm53ctl.kernels.state import DsaCache

CACHES = ("latent", "index_key", "index_gate", "pooled")


class SparseLaunch(DenseLaunch):
    """One build key of `sparse` for one rank, with room for `slots` cached tokens per row (whole pools). A call
    takes H, the weights, the caches (replicated; written at pos only) and pos [R] int32 (tokens cached before
    the step)."""

    def __init__(
        self, spec, tp: int, rows: int, knobs: dict, device, rank: int = 0, mode: str = "full", slots: int = 4
    ):
        super().__init__(spec, tp, rows, knobs, device, rank, mode, ffn="moe", attn="mla", slots=slots)
        d, R = self.d, rows
        f32, bf16, i32 = torch.float32, torch.bfloat16, torch.int32
        e = lambda *shape, dtype=f32: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
        self.buf |= {
            "y_a": e(R, d.NA),
            "qr": e(R, d.QL, dtype=bf16),
            "wi": e(R, d.HI),
            "q_mla": e(R, d.HQ * d.NOPE, dtype=bf16),
            "qi": e(R, d.HI * d.IH),
            "q_lat": e(R, d.HQ, d.C, dtype=bf16),
            "scores": e(R, d.LMAX // d.KP),
            "idx": e(R, d.WIDTH, dtype=i32),
            "part_o": e(R, d.NB, d.HQ, d.C),
            "part_m": e(R, d.NB, d.HQ),
            "part_l": e(R, d.NB, d.HQ),
            "o_lat": e(R, d.HQ, d.C, dtype=bf16),
            "o_mla": e(R, d.HQ * d.V, dtype=bf16),
        }
        self.out["dsa.idx"] = self.buf["idx"]

    def poison(self) -> None:
        super().poison()
        self.buf["idx"].fill_(-2)  # never a token, never the padding

    def state_args(self, cache: DsaCache, pos: torch.Tensor) -> dict:
        return dict(zip(CACHES, (cache.latent, cache.index_key, cache.index_gate, cache.pooled_key), strict=True)) | {
            "pos": pos
        }

    def __call__(
        self, H, w, cache: DsaCache, pos, stuck_site=-1, budget_ns=None, check=True
    ) -> dict[str, torch.Tensor]:
        R, d = self.rows, self.d
        assert H.shape == (R, d.HC, d.D) and H.dtype == torch.bfloat16 and H.is_contiguous()
        assert cache.latent.shape == (R, d.LMAX, d.C) and cache.latent.dtype == torch.bfloat16
        assert pos.shape == (R,) and pos.dtype == torch.int32
        if check:  # reads pos back: not while a CUDA graph captures (check=False there)
            assert int(pos.max()) < d.LMAX, f"a row's position is past the caches' {d.LMAX} slots"
        args = self.kernel_args(H, w, self.conv_out, self.S_out, stuck_site, budget_ns or DEFAULT_BUDGET_NS)
        self.launch(args | self.state_args(cache, pos), check)
        return self.out

    def placeholder_args(self) -> dict:
        bf16, i32 = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.int32)
        cache = DsaCache(bf16, bf16, bf16, bf16)
        return super().placeholder_args() | self.state_args(cache, i32)


__all__ = ["CACHES", "SparseLaunch"]
