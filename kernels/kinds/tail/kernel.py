"""The `tail` kernel: the claim loop over the tail's tasks (table.py), running the tail op's bodies."""

from __future__ import annotations

import triton
import triton.language as tl

from glm53ctl.kernels.ops.gemv.kernel import gemv_tile
from glm53ctl.kernels.ops.tail.kernel import final_norm_row, lm_head_folded
from glm53ctl.kernels.ops.tail.tasks import TAIL_GATHER, TAIL_LM_HEAD, TAIL_NORM
from glm53ctl.kernels.runtime import device
from glm53ctl.kernels.runtime.tasks import fields


@triton.jit(do_not_specialize=["stuck_site", "budget_ns", "rank", "mute", "n_pushers", "peer_words"])
def tail_kernel(
    rt,
    H,
    norm_w,
    h_hat,
    rstd,
    lm_w,
    logits,
    peers,
    R,
    eps,
    rank,
    mute,
    n_pushers,
    n_tasks,
    n_peers,
    peer_words,
    n_programs,
    stuck_site,
    budget_ns,
    dims: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
    NORM_FOLD: tl.constexpr,
    PDL: tl.constexpr,
    ONE_TASK: tl.constexpr,
    REMOTE: tl.constexpr,
):
    # the peers' logits (emulated: a buffer; real ranks: this rank's mailbox) and what a real rank pushes to
    peer_logits, peer_slots, peer_flags, arrive = peers
    D: tl.constexpr = dims.D
    HC: tl.constexpr = dims.HC
    V_LOCAL: tl.constexpr = dims.V_LOCAL
    V: tl.constexpr = dims.V
    BLOCK_N: tl.constexpr = dims.BLOCK_N
    BLOCK_K: tl.constexpr = dims.BLOCK_K
    GATHER_COLS: tl.constexpr = dims.GATHER_COLS
    M: tl.constexpr = dims.M
    TP: tl.constexpr = dims.TP
    ctl, flags = rt.ctl, rt.flags  # the runtime's buffers (runtime/launch.py RuntimeBuffers)
    if PDL:  # a stage of separate-pdl: ask for this program's first weights while the launch before ends
        first = device.task_row(rt, tl.minimum(tl.program_id(0), n_tasks - 1))
        if first[0] == TAIL_LM_HEAD:
            o_n = tl.minimum(first[1] + tl.arange(0, BLOCK_N), V_LOCAL - 1)
            o_l = tl.arange(0, D * 2 // 128) * 64
            device.prefetch_l2(lm_w + o_n[:, None].to(tl.int64) * D + o_l[None, :])
        device.pdl_enter(INTERPRET)
    epoch = device.launch_epoch(ctl, INTERPRET)
    # real ranks: this rank's logits columns start at rank * V_LOCAL, and the peers' come through the local
    # mailbox [2, TP, R, V_LOCAL], the half of this launch's parity
    own = 0
    half = 0
    if REMOTE:
        own = rank * V_LOCAL
        half = (epoch % 2) * TP * R * V_LOCAL
    n_done = 0
    task = device.first_task(ctl, n_tasks, n_programs, INTERPRET, ONE_TASK)
    while task >= 0:
        claim = device.claim_of(rt, task, epoch, stuck_site, budget_ns)
        row, ttype = claim.row, device.row_type(claim.row)
        nxt = task * 0 - 1
        ahead = 0
        # a task's early sites; a folded GEMV task's NORM sites are late: waited after its stream (below)
        ok = device.wait_task(claim, INTERPRET, POLL, THREADS, False)
        if ok:
            if ttype == TAIL_NORM:
                # ĥ[r] (an output, and norm "task"'s GEMV rows) and its 1/RMS (norm "fold"'s GEMV scale)
                r = fields(row, TAIL_NORM)
                final_norm_row(H, norm_w, h_hat, rstd, r, eps, D, HC, INTERPRET)
            elif ttype == TAIL_LM_HEAD:
                # GEMV: logits[:, n0:n0+n] (n <= BLOCK_N) of this rank's vocab slice (rank 0: columns 0..V_LOCAL)
                n0, n = fields(row, TAIL_LM_HEAD)
                o_n = n0 + tl.arange(0, BLOCK_N)
                n_end = n0 + n
                if NORM_FOLD:
                    o_m = tl.arange(0, M // HC)
                    acc = lm_head_folded(H, lm_w, n0, R, D, HC, n_end, BLOCK_N, BLOCK_K, M, INTERPRET)
                    # the next claim goes out before the wait, so its round trip overlaps the poll's (a task
                    # claimed here and then dropped on a failed wait is harmless: the launch is aborted)
                    nxt = device.after_task(ctl, n_tasks, n_done + 1, n_programs, INTERPRET, True, ONE_TASK)
                    ahead = 1
                    ok = device.wait_task(claim, INTERPRET, POLL, THREADS, True)
                    # the mean of the streams, then the rows' 1/RMS (the norm weight is in lm_w)
                    acc = acc / HC * tl.load(rstd + o_m, mask=o_m < R, other=0.0)[:, None]
                else:
                    o_m = tl.arange(0, 16)
                    acc = gemv_tile(h_hat, D, lm_w, n0, R, n_end, D, D, BLOCK_N, BLOCK_K, INTERPRET)
                p_o = logits + o_m[:, None].to(tl.int64) * V + own + o_n[None, :]
                m_o = (o_m[:, None] < R) & (o_n[None, :] < n_end) & ok
                tl.store(p_o, acc, mask=m_o)
                if REMOTE:
                    # this tile into slot `rank` of every peer's mailbox; the last tile's task writes the tag
                    for q in range(TP):
                        if q != rank:
                            dst = tl.load(peer_slots + q).to(tl.pointer_type(tl.float32)) + half + rank * R * V_LOCAL
                            tl.store(dst + o_m[:, None] * V_LOCAL + o_n[None, :], acc, mask=m_o)
                    if ok:
                        device.push_tag(peer_flags, arrive, epoch, rank, peer_words, n_pushers, mute, TP, INTERPRET)
            else:
                # GATHER: peer p's logits columns c0.. into their place in the full rows, every row at once
                # (a loop over rows is R dependent round trips: at 8 rows the copies outlasted the stream), in
                # 256-column pieces (a whole [8, 1024] tile's addresses take 250 registers)
                p, c0 = fields(row, TAIL_GATHER)
                o_r = tl.arange(0, 8)
                src_p = peer_logits + (p - 1) * R * V_LOCAL
                dst_p = logits + p * V_LOCAL
                if REMOTE:
                    # the p-th peer (1-based, in rank order without this rank): its rows in this rank's mailbox
                    peer = p - 1 + (p - 1 >= rank).to(tl.int32)
                    device.fence_sys(INTERPRET)  # its rows after its tag, seen at system scope
                    src_p = peer_logits + half + peer * R * V_LOCAL
                    dst_p = logits + peer * V_LOCAL
                for c in range(c0, c0 + GATHER_COLS, 256):
                    o_c = c + tl.arange(0, 256)
                    m_rc = (o_r[:, None] < R) & (o_c[None, :] < V_LOCAL)
                    src = src_p + o_r[:, None] * V_LOCAL + o_c[None, :]
                    dst = dst_p + o_r[:, None] * V + o_c[None, :]
                    tl.store(dst, tl.load(src, mask=m_rc), mask=m_rc)
            if ok:
                device.publish(rt, row, task, epoch, INTERPRET)
        n_done += 1
        if ahead == 0:
            task = device.after_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok, ONE_TASK)
        else:
            task = tl.where(ok, nxt, -1)
    device.finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)
