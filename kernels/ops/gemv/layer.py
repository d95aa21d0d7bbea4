"""The GEMV tasks of the layer kernel (kernels/kinds/layer/): a GEMV's output rows over a K slice, with its waits
(`task_partial`: o_proj's and down's, this rank's partial), or with none (`task_gemv`: MLA's A projection), and a
folded GEMV's sums over H's stream rows (`fold_rows`, knob `norm`)."""

import triton
import triton.language as tl

from glm53ctl.kernels.ops.gemv.kernel import gemv_first_weights, gemv_tile, gemv_tile_from, sum_streams
from glm53ctl.kernels.runtime.device import pdl_wait, stamp, wait_task
from glm53ctl.kernels.tlx import pinned

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.kinds.layer.shared"

PR = tl.constexpr(8)  # floats per row of the gates' pre [HC] and 1/RMS (buffer "pr")


@triton.jit
def gemv_rows(R, dims: tl.constexpr, sched: tl.constexpr):
    """A K-sliced GEMV task's input rows: R, or (knob `norm` fold) H's R * HC stream rows."""
    XR = R
    if sched.FOLD:
        XR = R * dims.HC
    return XR


@triton.jit
def wait_after_weights(
    claim, trace, sched: tl.constexpr, INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr
):
    """Knob weights_first, a body's first weight chunks in flight: gdc_wait where chained by PDL, then the task's
    early waits (the claim loop left them to the body), stamped in a trace. True unless a wait failed."""
    pdl_wait(sched.PDL_FIRST)
    ok = wait_task(claim, INTERPRET, POLL, THREADS, False)
    if sched.TRACE:
        stamp(trace, claim.task, 1, INTERPRET)
    return ok


@triton.jit
def fold_rows(acc, pr, R, HC: tl.constexpr, M: tl.constexpr, BN: tl.constexpr):
    """A folded GEMV's sums over H's stream rows [M, BN] to its rows' sums [M / HC, BN]:
    y[r] = 1/RMS[r] * sum_j pre[r, j] * acc[r * HC + j], with the gate's pre and 1/RMS from `pr`."""
    o_s = tl.arange(0, M)
    b_pre = tl.load(pr + (o_s // HC) * PR + o_s % HC, mask=o_s < R * HC, other=0.0)
    y = sum_streams(acc * b_pre[:, None], M, HC, BN)
    o_m = tl.arange(0, M // HC)
    return y * tl.load(pr + o_m * PR + HC, mask=o_m < R, other=0.0)[:, None]


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_gemv(
    x,
    w,
    out,
    n0,
    R,
    N: tl.constexpr,
    K: tl.constexpr,
    STRIDE: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """A GEMV's output rows n0.. over K (x, w already offset to it): out [R, N] fp32 (MLA's fused A projection)."""
    acc = gemv_tile(x, STRIDE, w, n0, R, N, K, STRIDE, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    tl.store(out + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N))


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_partial(
    claim, x, w, out, n0, R, N: tl.constexpr, K: tl.constexpr, STRIDE: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr, FIRST: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """OPROJ / DOWN: output rows n0.. over one K slice (x, w already offset to it): out [R, N]. FIRST (knob
    weights_first): the tile's first K chunk is loaded, then the task waits for its input (its sites are late;
    chained, PDL: gdc_wait first), then it sums as gemv_tile does: the same bits. Returns ok."""
    ok = claim.task >= 0
    if FIRST:
        b_w0 = gemv_first_weights(w, n0, N, STRIDE, BN, BK)
        pdl_wait(PDL)
        ok = wait_task(claim, INTERPRET, POLL, THREADS, True)
        acc = gemv_tile_from(b_w0, x, STRIDE, w, n0, R, N, K, STRIDE, BN, BK, INTERPRET)
    else:
        acc = gemv_tile(x, STRIDE, w, n0, R, N, K, STRIDE, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    tl.store(out + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N) & ok)
    return ok
