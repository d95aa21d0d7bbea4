"""Device side of the persistent launch runtime (DESIGN.md §3, §4): claim, wait, publish, finish.

Every launch kind's kernel is a loop over `claim`; these helpers are inlined into it.

Buffers (int32, see runtime/table.py for the host side):
  ctl[0] tag: the last finished launch's epoch; this launch publishes epoch = tag + 1
  ctl[1] claim counter, ctl[2] programs done: reset by the last program, so no host reset
  ctl[3] abort word (set by a program that timed out), ctl[4] lowest task that timed out
  flags[task]: the epoch once task published (a word per producer)
  boxes[line * 32 + slot]: a consumer's own 128-byte lines, a word per producer
  errs[program, 0:5]: site, task, program, expected epoch, value seen (of that program's time-out)
Sites: wait_kind / wait_index / wait_count per site, numbered in task-table order.
"""

import triton
import triton.language as tl

BOX_WORDS = 32  # 128-byte lines of int32


@triton.jit
def _ld_relaxed(p):
    return tl.inline_asm_elementwise(
        "ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _ld_acquire(p):
    return tl.inline_asm_elementwise(
        "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _nanosleep():
    tl.inline_asm_elementwise("nanosleep.u32 64; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _poll(p, POLL: tl.constexpr):
    """One poll of word p by every thread. POLL 0: ld.acquire.gpu; 1: ld.relaxed.gpu (acquired after)."""
    if POLL == 0:
        v = _ld_acquire(p)
    else:
        v = _ld_relaxed(p)
    return v


@triton.jit
def launch_epoch(ctl):
    """This launch's epoch: every program reads the tag before any program can finish and advance it."""
    return tl.atomic_add(ctl + 0, 0, sem="acquire", scope="gpu") + 1


@triton.jit
def claim(ctl, n_tasks):
    """The next task in topological order, or -1 when none is left or the launch aborted."""
    t = tl.atomic_add(ctl + 1, 1, sem="relaxed", scope="gpu")
    aborted = tl.atomic_add(ctl + 3, 0, sem="relaxed", scope="gpu")
    return tl.where((t < n_tasks) & (aborted == 0), t, -1)


@triton.jit
def wait_site(
    ctl, flags, boxes, errs, wait_kind, wait_index, wait_count, site, task, epoch, stuck_site, budget_ns,
    INTERPRET: tl.constexpr, POLL: tl.constexpr,
):
    """Wait until the site's producers published `epoch`; True, or False after a time-out was recorded
    (or another program aborted the launch).

    The spin is per thread (scalar polls and timer reads, no barrier inside it); the verdict is taken on
    scalar acquire atomics, which are CTA-wide (barrier, thread 0, broadcast), so every warp agrees.
    In the interpreter, which runs programs one after another, a wait not satisfied at once never is."""
    kind = tl.load(wait_kind + site)
    index = tl.load(wait_index + site).to(tl.int64)
    n_words = tl.where(kind == 0, 1, tl.load(wait_count + site))
    base = tl.where(kind == 0, flags + index, boxes + index * 32)
    live = site != stuck_site  # fault injection: a stuck site never sees its epoch
    if not INTERPRET:
        for j in range(n_words):
            v = _poll(base + j, POLL)
            start = _globaltimer()
            now = start
            aborted = _ld_relaxed(ctl + 3)
            while ((v != epoch) | (live == 0)) & (now - start < budget_ns) & (aborted == 0):
                if POLL == 1:
                    _nanosleep()
                v = _poll(base + j, POLL)
                now = _globaltimer()
                aborted = _ld_relaxed(ctl + 3)
    ok = live
    seen = epoch
    for j in range(n_words):
        w = tl.atomic_add(base + j, 0, sem="acquire", scope="gpu")
        seen = tl.where(w != epoch, w, seen)
        ok = ok & (w == epoch)
    if ok == 0:
        aborted = tl.atomic_add(ctl + 3, 0, sem="relaxed", scope="gpu")
        if aborted == 0:
            # a real time-out (not a stop because another program aborted): record it, then abort all
            pid = tl.program_id(0).to(tl.int64)
            tl.store(errs + pid * 5 + 0, site)
            tl.store(errs + pid * 5 + 1, task)
            tl.store(errs + pid * 5 + 2, tl.program_id(0))
            tl.store(errs + pid * 5 + 3, epoch)
            tl.store(errs + pid * 5 + 4, seen)
            tl.atomic_min(ctl + 4, task, sem="relaxed", scope="gpu")
            tl.debug_barrier()
            tl.atomic_xchg(ctl + 3, 1, sem="release", scope="gpu")
    return ok


@triton.jit
def publish(ctl, flags, boxes, pub_first, pub_count, pub_slot, task, epoch):
    """Release this task's payload: its flag word, and a word in each box line that waits on it."""
    # Triton 3.6 emits no barrier before a scalar release atomic: other warps' payload stores first
    tl.debug_barrier()
    tl.atomic_xchg(flags + task, epoch, sem="release", scope="gpu")
    first = tl.load(pub_first + task)
    n = tl.load(pub_count + task)
    for c in range(0, n, 32):
        o = c + tl.arange(0, 32)
        slot = tl.load(pub_slot + first + o, mask=o < n, other=0).to(tl.int64)
        tl.atomic_xchg(boxes + slot, epoch + o * 0, mask=o < n, sem="release", scope="gpu")


@triton.jit
def finish(ctl, flags, n_tasks, n_peers, n_programs, epoch):
    """The last program to finish resets the counters and advances the tag (release).

    On one GPU the peers' partials are in place before every launch, so their words are set to the
    epoch the next launch will expect."""
    tl.debug_barrier()
    done = tl.atomic_add(ctl + 2, 1, sem="acq_rel", scope="gpu")
    if done == n_programs - 1:
        o = tl.arange(0, 8)
        tl.store(flags + n_tasks + o, epoch + 1 + o * 0, mask=o < n_peers)
        tl.atomic_xchg(ctl + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(ctl + 2, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(ctl + 0, epoch, sem="release", scope="gpu")
