"""The GEMV task body every kind reuses: rows 1-8 padded to a 16-row `tl.dot` tile, fp32 accumulation
over K in a fixed order (so the result depends on neither grid nor schedule)."""

import triton
import triton.language as tl

from glm53ctl.kernels.tlx import interpreting


@triton.jit
def mma(acc, b_x, b_w, INTERPRET: tl.constexpr):
    """acc + b_x @ b_w^T: b_x [M, BK] and b_w [BN, BK] bf16, acc [M, BN] fp32."""
    if INTERPRET:
        # the interpreter's bf16 tl.dot returns garbage (docs/design.md §4), and its fp32 one sums in an order that
        # depends on the tile's shape; in fp64 the bf16 products sum exactly
        return acc + tl.dot(b_x.to(tl.float64), tl.trans(b_w.to(tl.float64))).to(tl.float32)
    else:
        return tl.dot(b_x, tl.trans(b_w), acc)


@triton.jit
def gemv_tile(
    x,
    stride_x,
    w,
    n0,
    R,
    N,
    K: tl.constexpr,
    STRIDE_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    M: tl.constexpr = 16,
):
    """acc[m, n] = sum_k x[m, k] * w[n0 + n, k] for m < R: [M, BLOCK_N] fp32 (rows >= R are zero; M >= R, 16 the
    smallest `tl.dot` tile).

    x: [R, K] bf16 rows with stride stride_x; w: bf16 rows n0.. up to N (exclusive) STRIDE_W apart (K
    contiguous; a split-K slice of a wider matrix has STRIDE_W > K). Both strides constexpr: loads keep their
    16-byte width."""
    o_m = tl.arange(0, M)
    o_n = n0 + tl.arange(0, BLOCK_N)
    m_m = o_m < R
    m_n = o_n < N
    acc = tl.zeros((M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(x + o_m[:, None].to(tl.int64) * stride_x + o_k[None, :], mask=m_m[:, None], other=0.0)
        b_w = tl.load(w + o_n[:, None].to(tl.int64) * STRIDE_W + o_k[None, :], mask=m_n[:, None], other=0.0)
        acc = mma(acc, b_x, b_w, INTERPRET)
    return acc


@triton.jit
def gemv_first_weights(w, n0, N, STRIDE_W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The first K chunk of gemv_tile's weight tile, [BLOCK_N, BLOCK_K] bf16 (the whole tile where BLOCK_K covers
    its K): loaded before a task waits for its input, so its weights stream while it waits (gemv_tile_from)."""
    o_n = n0 + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    return tl.load(w + o_n[:, None].to(tl.int64) * STRIDE_W + o_k[None, :], mask=(o_n < N)[:, None], other=0.0)


@triton.jit
def gemv_tile_from(
    b_w0,
    x,
    stride_x,
    w,
    n0,
    R,
    N,
    K: tl.constexpr,
    STRIDE_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    M: tl.constexpr = 16,
):
    """gemv_tile, its first weight chunk b_w0 loaded already (gemv_first_weights, before the wait): the same
    products summed in the same order, so the same bits, whenever the weights were loaded."""
    o_m = tl.arange(0, M)
    o_n = n0 + tl.arange(0, BLOCK_N)
    m_m = o_m < R
    m_n = o_n < N
    o_k = tl.arange(0, BLOCK_K)
    b_x = tl.load(x + o_m[:, None].to(tl.int64) * stride_x + o_k[None, :], mask=m_m[:, None], other=0.0)
    acc = mma(tl.zeros((M, BLOCK_N), dtype=tl.float32), b_x, b_w0, INTERPRET)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(x + o_m[:, None].to(tl.int64) * stride_x + o_k[None, :], mask=m_m[:, None], other=0.0)
        b_w = tl.load(w + o_n[:, None].to(tl.int64) * STRIDE_W + o_k[None, :], mask=m_n[:, None], other=0.0)
        acc = mma(acc, b_x, b_w, INTERPRET)
    return acc


@triton.jit
def gemv_tile_pair(
    x,
    stride_x,
    w1,
    w2,
    n0,
    R,
    N,
    K: tl.constexpr,
    STRIDE_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    M: tl.constexpr = 16,
):
    """gemv_tile over two matrices of one shape in one K loop (gate and up): each accumulator sums in
    gemv_tile's order (the same bits), and each pipelined step has both tiles in flight, twice the bytes of
    one: a program streams twice as fast where its loads in flight, not the bandwidth, set the pace."""
    o_m = tl.arange(0, M)
    o_n = n0 + tl.arange(0, BLOCK_N)
    m_m = o_m < R
    m_n = o_n < N
    acc1 = tl.zeros((M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(x + o_m[:, None].to(tl.int64) * stride_x + o_k[None, :], mask=m_m[:, None], other=0.0)
        p_w = o_n[:, None].to(tl.int64) * STRIDE_W + o_k[None, :]
        b_w1 = tl.load(w1 + p_w, mask=m_n[:, None], other=0.0)
        b_w2 = tl.load(w2 + p_w, mask=m_n[:, None], other=0.0)
        acc1 = mma(acc1, b_x, b_w1, INTERPRET)
        acc2 = mma(acc2, b_x, b_w2, INTERPRET)
    return acc1, acc2


@triton.jit
def gemv_tile_pair_from(
    b_w1,
    b_w2,
    x,
    stride_x,
    w1,
    w2,
    n0,
    R,
    N,
    K: tl.constexpr,
    STRIDE_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    M: tl.constexpr = 16,
):
    """gemv_tile_pair, the first weight chunk of each matrix loaded already (gemv_first_weights, before the
    wait): the same sums in the same order as gemv_tile_pair."""
    o_m = tl.arange(0, M)
    o_n = n0 + tl.arange(0, BLOCK_N)
    m_m = o_m < R
    m_n = o_n < N
    o_k = tl.arange(0, BLOCK_K)
    b_x = tl.load(x + o_m[:, None].to(tl.int64) * stride_x + o_k[None, :], mask=m_m[:, None], other=0.0)
    acc1 = mma(tl.zeros((M, BLOCK_N), dtype=tl.float32), b_x, b_w1, INTERPRET)
    acc2 = mma(tl.zeros((M, BLOCK_N), dtype=tl.float32), b_x, b_w2, INTERPRET)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        b_x = tl.load(x + o_m[:, None].to(tl.int64) * stride_x + o_k[None, :], mask=m_m[:, None], other=0.0)
        p_w = o_n[:, None].to(tl.int64) * STRIDE_W + o_k[None, :]
        b_v1 = tl.load(w1 + p_w, mask=m_n[:, None], other=0.0)
        b_v2 = tl.load(w2 + p_w, mask=m_n[:, None], other=0.0)
        acc1 = mma(acc1, b_x, b_v1, INTERPRET)
        acc2 = mma(acc2, b_x, b_v2, INTERPRET)
    return acc1, acc2


@triton.jit
def sum_streams(acc, M: tl.constexpr, HC: tl.constexpr, BLOCK_N: tl.constexpr):
    """A folded GEMV's sums over stream rows [M, BLOCK_N] (row r * HC + j: row r's stream j) to its rows' sums
    [M / HC, BLOCK_N], the streams added in stream order: ((s0 + s1) + s2) + s3. A tl.sum over them adds them
    in an order set by the tile's layout, so by its height, a schedule knob (dense's block_n_in 64 gave other
    bits on the H200); here the streams are taken apart by data movement alone (permute, split), then added."""
    tl.static_assert(HC == 4, "the mHC streams are 4")
    t = tl.reshape(tl.permute(tl.reshape(acc, (M // HC, HC, BLOCK_N)), (0, 2, 1)), (M // HC, BLOCK_N, 2, 2))
    even, odd = tl.split(t)  # stream j = 2a + b: b = 0 and b = 1, each [M / HC, BLOCK_N, 2] over a
    s0, s2 = tl.split(even)
    s1, s3 = tl.split(odd)
    return ((s0 + s1) + s2) + s3


@triton.jit
def gemv_kernel(
    x, w, y, R, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr
):
    """One GEMV tile per program as a plain launch: y [R, N] fp32 = x [R, K] @ w [N, K]^T."""
    n0 = tl.program_id(0) * BLOCK_N
    acc = gemv_tile(x, K, w, n0, R, N, K, K, BLOCK_N, BLOCK_K, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(y + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N))


def folds(norm: str, rows: int, streams: int) -> bool:
    """Whether knob `norm` folds the norm into the GEMV after it: "fold" always; "auto" while H's rows x streams
    stream rows fit the 16-row `tl.dot` tile that rows alone need anyway (rows <= 4 at 4 streams): past it the
    folded GEMV moves and multiplies twice the rows (dense on the H200 at rows 8: TP1 284.6 folded, 249.8 not;
    at rows 1-4 folding was faster at every TP, docs/perf/dense.md)."""
    return norm == "fold" or (norm == "auto" and rows * streams <= 16)


def fold_norm(norm_w, w):
    """A GEMV's weight rows times the RMSNorm weight before it, rounded to bf16 once (where `folds`: the
    GEMV then reads un-normalized rows and scales its sums by their 1/RMS)."""
    import torch

    return (w.float() * norm_w.float()[None, :]).to(torch.bfloat16).contiguous()


def gemv(x, w, block_n: int = 64, block_k: int = 128):
    """y = x @ w^T for x [R, K] bf16 (R <= 16) and w [N, K] bf16, as one plain launch: y [R, N] fp32."""
    import torch

    R, K = x.shape
    N = w.shape[0]
    assert x.dtype == w.dtype == torch.bfloat16 and w.shape[1] == K and R <= 16
    y = torch.empty(R, N, dtype=torch.float32, device=x.device)
    bk = min(block_k, K)
    gemv_kernel[(triton.cdiv(N, block_n),)](
        x.contiguous(),
        w.contiguous(),
        y,
        R,
        N=N,
        K=K,
        BLOCK_N=block_n,
        BLOCK_K=bk,
        INTERPRET=interpreting(),
    )
    return y
