"""The `embed` kernel: the claim loop over embed's tasks (table.py), running the embed op's bodies."""

from __future__ import annotations

import triton
import triton.language as tl

from glm53ctl.kernels.ops.embed.kernel import gather_row, reduce_row
from glm53ctl.kernels.ops.embed.tasks import EMBED_GATHER
from glm53ctl.kernels.runtime import device
from glm53ctl.kernels.runtime.tasks import fields


@triton.jit(do_not_specialize=["stuck_site", "budget_ns", "rank", "mute", "peer_words"])
def embed_kernel(
    rt, tokens, table, partial, peer_partials, H, peer_slots, peer_flags, arrive, R, rank, mute, vocab_offset,
    n_tasks, n_peers, peer_words, n_programs, stuck_site, budget_ns, D: tl.constexpr, HC: tl.constexpr,
    V_LOCAL: tl.constexpr, TP: tl.constexpr, CHUNK: tl.constexpr, INTERPRET: tl.constexpr, POLL: tl.constexpr,
    THREADS: tl.constexpr, PDL: tl.constexpr, ONE_TASK: tl.constexpr, REMOTE: tl.constexpr,
):  # fmt: skip
    ctl, flags = rt.ctl, rt.flags  # the runtime's buffers (runtime/launch.py RuntimeBuffers)
    if PDL:  # a stage of separate-pdl: the token ids are the launch's input, so nothing to ask for first
        device.pdl_enter(INTERPRET)
    epoch = device.launch_epoch(ctl, INTERPRET)
    # where this rank's partial goes and what the reduce sums (slot 0, then the rest, in rank order): the
    # emulation's own buffers; real ranks' mailbox [2, TP, R, D], the half of this launch's parity
    mine = partial
    first = partial
    rest = peer_partials
    if REMOTE:
        first = partial + (epoch % 2) * TP * R * D
        mine = first + rank * R * D
        rest = first + R * D
    n_done = 0
    task = device.first_task(ctl, n_tasks, n_programs, INTERPRET, ONE_TASK)
    while task >= 0:
        claim = device.claim_of(rt, task, epoch, stuck_site, budget_ns)
        row, ttype = claim.row, device.row_type(claim.row)
        d0 = fields(row, EMBED_GATHER)
        ok = device.wait_task(claim, INTERPRET, POLL, THREADS, False)
        if REMOTE:
            if ttype != EMBED_GATHER:
                device.fence_sys(INTERPRET)  # the peers' rows after their tags, seen at system scope
        if ok:
            o_d = d0 + tl.arange(0, CHUNK)
            for r in range(R):
                if ttype == EMBED_GATHER:
                    gather_row(tokens, table, mine, r, vocab_offset, o_d, D, V_LOCAL)
                else:
                    reduce_row(first, rest, H, r, R, o_d, D, HC, TP)
            if REMOTE:
                if ttype == EMBED_GATHER:
                    device.push_rows(mine, peer_slots, epoch, rank, R, o_d, D, TP)
                    device.push_tag(
                        peer_flags, arrive, epoch, rank, peer_words, (D + CHUNK - 1) // CHUNK, mute, TP, INTERPRET
                    )
            device.publish(rt, row, task, epoch, INTERPRET)
        n_done += 1
        task = device.after_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok, ONE_TASK)
    device.finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)
