"""Device side of the persistent launch runtime (docs/design.md §3, §4): claim, wait, publish, finish.

Every launch kind's kernel is a loop over `claim`; these helpers are inlined into it.

Buffers (int32, see runtime/table.py for the host side):
  ctl[0] tag: the last finished launch's epoch; this launch publishes epoch = tag + 1
  ctl[1] claim counter, ctl[2] programs done (+ ABORTED once a program aborted): reset by the last program,
  so no host reset
  ctl[3] abort word: the epoch of a launch a program timed out in, ctl[4] the lowest task that timed out;
  the last program moves both to ctl[5] / ctl[6] for the host and clears them, so the next launch starts
  clean even if nobody called the host check (a CUDA graph replaying a faulted launch, say)
  flags[task]: the epoch once task published (a word per producer)
  boxes[line * 32 + slot]: a consumer's own 128-byte lines, a word per producer
  ctl[8 + i]: the i-th task claimed, in the interpreter only (table order unless Runtime.shuffle)
  errs[program, 0:5]: site, task, program, expected epoch, value seen (of that program's time-out)
Sites: wait_kind / wait_index / wait_count per site, numbered in task-table order.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from glm53ctl.kernels import tlx  # noqa: F401 - the interpreter's settings before any kernel is defined

BOX_WORDS = 32  # 128-byte lines of int32
CTL_WORDS = tl.constexpr(8)  # the control words; the interpreter's claim order follows them
TASK_FIELDS = tl.constexpr(16)  # int32 words of a task's row: see task_row
ABORTED = tl.constexpr(1 << 16)  # added to the programs-done counter by the first program to abort (grids stay below)


class Claim(NamedTuple):
    """A claimed task as its waits need it (`wait_task`): made once a program has its row, and handed whole to the
    bodies that wait inside their work (a late site, or weights first)."""

    rt: tl.tuple  # the runtime's buffers (launch.py `RuntimeBuffers`)
    row: tl.tuple  # the task's row (`task_row`)
    task: tl.tensor  # its index in the table (-1: none claimed)
    epoch: tl.tensor  # the epoch this launch publishes
    stuck_site: tl.tensor  # fault injection: the site that never sees its epoch (-1: none)
    budget_ns: tl.tensor  # how long a wait polls before it records a time-out


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
def _globaltimer(like):
    """%globaltimer (ns), read by every thread: one value per element of `like`."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [like], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _nanosleep(like, NS: tl.constexpr):
    tl.inline_asm_elementwise(
        f"nanosleep.u32 {NS}; mov.u32 $0, 0;", "=r,r", [like], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _fence_acq_rel(like):
    """fence.acq_rel.gpu: after relaxed polls saw the epoch, it orders this thread's later loads after them;
    before relaxed stores of box words (after a CTA barrier), it orders the CTA's payload before them."""
    tl.inline_asm_elementwise(
        "fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [like], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _poll(p, INTERPRET: tl.constexpr, POLL: tl.constexpr):
    """One poll of the words p (one element per thread). POLL 0: ld.acquire.gpu; 1: ld.relaxed.gpu."""
    if INTERPRET:
        v = tl.load(p, volatile=True)
    elif POLL == 0:
        v = _ld_acquire(p)
    else:
        v = _ld_relaxed(p)
    return v


@triton.jit
def launch_epoch(ctl, INTERPRET: tl.constexpr):
    """This launch's epoch: every program reads the tag before any program can finish and advance it.
    A relaxed load, not an acquire: the tag cannot change during the launch and the launch before this one
    has ended, so nothing needs ordering after it (an acquire would hold back the first claim)."""
    return tl.max(_poll(ctl + tl.arange(0, 1) * 0, INTERPRET, 1), axis=0) + 1


@triton.jit
def pdl_enter(INTERPRET: tl.constexpr):
    """A launch chained by programmatic dependent launch (the separate-pdl baseline): this one waits until the
    launch before it has ended and its writes are visible, then lets the next launch start (which asks L2 for
    its first weights, then waits here in turn). Before this call a program reads nothing another launch writes
    (its task table and weights only: with every launch starting early, any launch before may still run)."""
    if not INTERPRET:
        tl.extra.cuda.gdc_wait()
        # only now: dependents launched at this launch's own start would let theirs start too, and so on down
        # the chain, every launch's programs resident and waiting at once
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Where a chained launch's task has issued its weights (knob weights_first): wait until the launch before it
    has ended and its writes are visible (a no-op once waited, and without PDL)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def stamp(trace, task, slot, INTERPRET: tl.constexpr):
    """A task's trace record [5] (runtime/trace.py): the %globaltimer (ns) at `slot` (0 claimed, 1 inputs
    ready, 2 published, 4 its own work done before its late waits), and the program at slot 3. The interpreter
    has no timer: it stores the program only."""
    p = trace + task.to(tl.int64) * 5
    if not INTERPRET:
        tl.store(p + slot, tl.max(_globaltimer(tl.arange(0, 1)), axis=0))
    if slot == 0:
        tl.store(p + 3, tl.program_id(0).to(tl.int64))


@triton.jit
def prefetch_l2(p):
    """Ask L2 for the 128-byte lines at p (a tensor of addresses); nothing is returned or waited for."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [p], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def arrive_last(word, epoch, n):
    """One of n arrivals at `word` in this launch: True for the last to arrive. Release and acquire at gpu
    scope: what every arrival stored before it (after a CTA barrier) is visible to the last one after it.

    The word holds (epoch mod 2^23) << 8 | arrivals (n < 256), so a word an earlier launch left (an aborted
    launch's partial count included) counts as no arrivals: no host reset, as for the flags."""
    tag = (epoch & 0x7FFFFF) << 8
    cur = tl.atomic_add(word, 0, sem="relaxed", scope="gpu")
    new = cur
    done = 0
    while done == 0:  # a compare-and-swap loop among the n arrivals: lock-free, no wait
        new = tl.where((cur & -256) == tag, cur, tag) + 1
        seen = tl.atomic_cas(word, cur, new, sem="acq_rel", scope="gpu")
        done = (seen == cur).to(tl.int32)
        cur = seen
    return (new & 255) == n


@triton.jit
def claim(ctl, n_tasks):
    """The next task in topological order, or -1 when none is left. An abort pushes the counter past
    every task (see wait_site), so this one atomic also stops the programs of an aborted launch."""
    t = tl.atomic_add(ctl + 1, 1, sem="relaxed", scope="gpu")
    return tl.where(t < n_tasks, t, -1)


@triton.jit
def next_task(ctl, n_tasks, n_done, n_programs, INTERPRET: tl.constexpr, ok=True):
    """The next task to run, or -1. `ok`: the last wait succeeded. A program whose wait failed claims nothing
    more: it may have seen the abort word before the aborter's push of the claim counter, and a claim then
    would give it a task whose failed wait overwrites its error record (the host could not name the root).

    In the interpreter, which runs programs one after another, every program but the last stops after its
    share of the tasks: so tasks and their hand-offs really spread over the programs there too (else
    program 0 would run them all and every grid would look the same)."""
    task = tl.full((), -1, tl.int32)
    go = ok
    if INTERPRET:
        share = (n_tasks + n_programs - 1) // n_programs
        go = go & ((n_done < share) | (tl.program_id(0) == n_programs - 1))
    if go:
        task = claim(ctl, n_tasks)
        if INTERPRET:
            # the claim order: table order, or a random topological order (Runtime.shuffle), so a wait left out
            # of the table shows in the interpreter too (the GPU claims in table order and reads none of this)
            if task >= 0:
                task = tl.load(ctl + CTL_WORDS + task)
    return task


@triton.jit
def first_task(ctl, n_tasks, n_programs, INTERPRET: tl.constexpr, ONE_TASK: tl.constexpr):
    """A program's first task: claimed (the claim loop), or with ONE_TASK (a launch of the stage schedule, one
    program per task) its own, by program id, with no claim at all."""
    if ONE_TASK:
        task = tl.program_id(0)
    else:
        task = next_task(ctl, n_tasks, 0, n_programs, INTERPRET)
    return task


@triton.jit
def after_task(ctl, n_tasks, n_done, n_programs, INTERPRET: tl.constexpr, ok, ONE_TASK: tl.constexpr):
    """The task after one (next_task), or -1; with ONE_TASK always -1: a program runs its one task."""
    if ONE_TASK:
        task = tl.full((), -1, tl.int32)
    else:
        task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok)
    return task


@triton.jit
def task_row(rt, task):
    """A task's row of the table (runtime/table.py TASK_FIELDS), every field loaded at once, right after the
    claim: type, a0, a1, a2, its wait sites (first, count), its publish list (flag, box words, first word),
    its first site's kind, index and word count, and how many of its sites are early. So neither its first
    wait nor its publish starts with a dependent load of the runtime's arrays: one round trip each fewer on
    every hand-off."""
    tasks = rt[4]
    p = tasks + task * TASK_FIELDS
    return (
        tl.load(p),
        tl.load(p + 1),
        tl.load(p + 2),
        tl.load(p + 3),
        tl.load(p + 4),
        tl.load(p + 5),
        tl.load(p + 6),
        tl.load(p + 7),
        tl.load(p + 8),
        tl.load(p + 9),
        tl.load(p + 10),
        tl.load(p + 11),
        tl.load(p + 12),
    )


@triton.jit
def claim_of(rt, task, epoch, stuck_site, budget_ns):
    """The claimed task `task` (`Claim`), its row loaded (`task_row`)."""
    return Claim(rt, task_row(rt, task), task, epoch, stuck_site, budget_ns)


@triton.jit
def row_type(row):
    """A task's type (its row's first word: kernels/runtime/tasks.py); its fields are its op's to unpack
    (`kernels/ops/<op>/tasks.py`)."""
    return row[0]


@triton.jit
def row_sites(row):
    """The runtime's words of a row about its waits: its first site, how many it has, how many are early, and
    the first one's kind, index and word count."""
    return row[4], row[5], row[12], row[9], row[10], row[11]


@triton.jit
def row_publish(row):
    """The runtime's words of a row about its publish: whether its flag word is written, how many box words,
    the first of them."""
    return row[6], row[7], row[8]


@triton.jit
def _arrived(v, epoch, kind):
    """Whether a polled word says its producer published this launch: the epoch; for a peer's word, the epoch or
    the next (a real peer may have published this launch's partial, finished, and published the next one)."""
    return (v == epoch) | ((kind == 2) & (v == epoch + 1))


@triton.jit
def wait_site(
    ctl,
    flags,
    boxes,
    errs,
    site,
    kind,
    index,
    n_words,
    task,
    epoch,
    stuck_site,
    budget_ns,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
):
    """Wait until the site's producers published `epoch`; True, or False after a time-out was recorded
    (or another program aborted the launch).

    Every thread polls the site's word(s) (a [THREADS] vector, one element per thread); the verdict is
    reduced over the CTA each round, the timer and the abort word every 8th round, so every warp takes the
    same branch. In the interpreter, which runs programs one after another, a wait not satisfied at once
    never is: it is judged on one poll, but a peer's words (kind 2, PEER) with real ranks, which another process
    writes, are polled until the budget (counted in polls there: the interpreter has no clock)."""
    index = index.to(tl.int64)
    o_t = tl.arange(0, THREADS)
    # a flag site: thread i reads word i % count of the consecutive flags from `index` (one word but for the
    # peers' site); a box site: word i % count of the line
    p = tl.where(kind == 1, boxes + index * 32 + o_t % n_words, flags + index + o_t % n_words)
    live = site != stuck_site  # fault injection: a stuck site never sees its epoch
    v = _poll(p, INTERPRET, POLL)
    ok = (tl.min(_arrived(v, epoch, kind).to(tl.int32), axis=0) != 0) & live
    if INTERPRET:
        if (ok == 0) & (kind == 2) & live:
            polls = 0
            while (ok == 0) & (polls < budget_ns // 10_000):
                v = _poll(p, INTERPRET, POLL)
                ok = tl.min(_arrived(v, epoch, kind).to(tl.int32), axis=0) != 0
                polls += 1
    if not INTERPRET:
        if ok == 0:
            # a round is one poll and one CTA-wide verdict; the clock and the abort word (each a CTA-wide
            # value, one of them a load's round trip) every 8th round only, and not at all when the words
            # are there at the first poll: the common hand-off pays no more than it must
            start = tl.max(_globaltimer(o_t), axis=0)
            now = start
            aborted = 0
            rounds = 0
            while (ok == 0) & (now - start < budget_ns) & (aborted == 0):
                if POLL == 1:
                    _nanosleep(o_t, 64)
                elif POLL == 2:  # a long wait among hundreds of waiting programs: poll 8x less often
                    _nanosleep(o_t, 512)
                v = _poll(p, INTERPRET, POLL)
                ok = (tl.min(_arrived(v, epoch, kind).to(tl.int32), axis=0) != 0) & live
                rounds += 1
                if rounds % 8 == 0:
                    now = tl.max(_globaltimer(o_t), axis=0)
                    aborted = tl.max(_ld_relaxed(ctl + 3 + o_t * 0), axis=0)
    if ok == 0:
        # a time-out, or a stop on another program's abort while this wait was still unsatisfied: either
        # way this task was blocked; the host names the lowest blocked task as the root
        if task >= 0:
            pid = tl.program_id(0).to(tl.int64)
            tl.store(errs + pid * 5 + 0, site)
            tl.store(errs + pid * 5 + 1, task)
            tl.store(errs + pid * 5 + 2, tl.program_id(0))
            tl.store(errs + pid * 5 + 3, epoch)
            tl.store(errs + pid * 5 + 4, tl.min(v, axis=0))
            tl.atomic_min(ctl + 4, task, sem="relaxed", scope="gpu")
        # the first to abort pushes the claim counter past every task: all programs stop claiming
        if tl.atomic_xchg(ctl + 3, epoch, sem="acq_rel", scope="gpu") == 0:
            tl.atomic_add(ctl + 1, 1 << 30, sem="relaxed", scope="gpu")
            # and marks the programs-done counter, so the last program learns of the abort from its own add
            tl.atomic_add(ctl + 2, ABORTED, sem="relaxed", scope="gpu")
    return ok


@triton.jit
def wait_task(claim, INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr, LATE: tl.constexpr):
    """The early wait sites of the claimed task (`Claim`; LATE: its late ones, at the end of its work), in order;
    False as soon as one times out or the launch aborted."""
    rt, row, task, epoch, stuck_site, budget_ns = claim
    ctl, flags, boxes, errs, tasks, wait_kind, wait_index, wait_count, _ = rt
    s0, n_sites, n_early, kind0, index0, words0 = row_sites(row)
    lo = s0
    hi = s0 + n_early
    if LATE:
        lo = s0 + n_early
        hi = s0 + n_sites
    ok = task >= 0
    for s in range(lo, hi):
        if ok:
            # the first site's words come with the row; later sites' from the site arrays
            kind = kind0
            index = index0
            n_words = words0
            if s != s0:
                kind = tl.load(wait_kind + s)
                index = tl.load(wait_index + s)
                n_words = tl.load(wait_count + s)
            ok = wait_site(
                ctl, flags, boxes, errs, s, kind, index, n_words, task, epoch, stuck_site, budget_ns, INTERPRET, POLL,
                THREADS,
            )  # fmt: skip
    if (not INTERPRET) and (POLL != 0):
        if hi > lo:
            # relaxed polls saw the epochs: one fence after all of them, not one per site (a fence waits for
            # the program's outstanding memory operations), then a barrier: every thread fenced after its
            # own words, so the CTA's later payload loads are ordered after all of them
            _fence_acq_rel(tl.arange(0, 1))
            tl.debug_barrier()
    return ok


@triton.jit
def _st_relaxed(p, v):
    tl.inline_asm_elementwise(
        "st.relaxed.gpu.global.b32 [$1], $2; mov.u32 $0, 0;", "=r,l,r", [p, v], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def publish(rt, row, task, epoch, INTERPRET: tl.constexpr):
    """Release this task's payload to those who wait on it: its flag word, and a word in each box line.
    A task nobody waits on (a GEMV slice of the logits) publishes nothing: no barrier, no atomic.
    row: the task's `task_row` (its publish list)."""
    _, flags, boxes, _, _, _, _, _, pub_slot = rt
    needs_flag, n, first = row_publish(row)
    if needs_flag + n > 0:
        # Triton 3.6 emits no barrier before a scalar release atomic: other warps' payload stores first
        tl.debug_barrier()
        if needs_flag != 0:
            tl.atomic_xchg(flags + task, epoch, sem="release", scope="gpu")
        # a broadcast producer writes hundreds of box words, 512 per round. On the GPU: one fence per thread
        # (after the barrier it orders the whole CTA's payload), then relaxed stores, instead of one release
        # atomic per word
        if not INTERPRET:
            _fence_acq_rel(tl.arange(0, 1))
        for c in range(0, n, 512):
            o = c + tl.arange(0, 512)
            if INTERPRET:
                slot = tl.load(pub_slot + first + o, mask=o < n, other=0).to(tl.int64)
                tl.atomic_xchg(boxes + slot, epoch + o * 0, mask=o < n, sem="release", scope="gpu")
            else:
                # lanes past n repeat the last word (the same value): inline asm has no mask
                slot = tl.load(pub_slot + first + tl.minimum(o, n - 1)).to(tl.int64)
                _st_relaxed(boxes + slot, epoch + o * 0)


@triton.jit
def finish(ctl, flags, n_tasks, n_peers, n_programs, epoch):
    """The last program to finish resets the counters and advances the tag.

    All relaxed: the next launch starts only after this one has ended, and the end of a kernel orders all
    its writes before the next kernel in the stream; within the launch, the counter words are only ever
    touched by atomics, which L2 keeps coherent. (An acq_rel count and a release tag cost the last program
    two round trips: it waited for its own output stores, then for the resets.)

    On one GPU the peers' partials are in place before every launch, so their words are set to the
    epoch the next launch will expect."""
    tl.debug_barrier()
    done = tl.atomic_add(ctl + 2, 1, sem="relaxed", scope="gpu")
    if done % ABORTED == n_programs - 1:
        o = tl.arange(0, 8)
        tl.store(flags + n_tasks + o, epoch + 1 + o * 0, mask=o < n_peers)
        if done >= ABORTED:  # hand the fault to the host, and start the next launch unaborted
            aborted = tl.atomic_xchg(ctl + 3, 0, sem="acq_rel", scope="gpu")
            tl.atomic_xchg(ctl + 5, aborted, sem="relaxed", scope="gpu")
            tl.atomic_xchg(
                ctl + 6, tl.atomic_xchg(ctl + 4, 2**31 - 1, sem="relaxed", scope="gpu"), sem="relaxed", scope="gpu"
            )
        tl.atomic_xchg(ctl + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(ctl + 2, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(ctl + 0, epoch, sem="relaxed", scope="gpu")


@triton.jit
def fence_sys(INTERPRET: tl.constexpr):
    """fence.acq_rel.sys: real ranks order their pushes to a peer before their tag, and a reduce's reads of the
    pushed rows after the peer site it polled at gpu scope (a peer is on another GPU: system scope)."""
    if not INTERPRET:
        tl.inline_asm_elementwise(
            "fence.acq_rel.sys; mov.u32 $0, 0;", "=r,r", [tl.arange(0, 1)], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def push_to_peers(vals, peer_slots, at, rank, o_d, mask, TP: tl.constexpr):
    """Real ranks: `vals` (over columns o_d, where `mask`) into every peer's mailbox at element `at` (fp32; the
    caller's slot `rank`, in the half of this launch's parity). `peer_slots`: every rank's mailbox address as
    this process maps it (int64)."""
    for q in range(TP):
        if q != rank:
            dst = tl.load(peer_slots + q).to(tl.pointer_type(tl.float32)) + at
            tl.store(dst + o_d, vals, mask=mask)


@triton.jit
def push_rows(mine, peer_slots, epoch, rank, R, o_d, D: tl.constexpr, TP: tl.constexpr):
    """Real ranks: this rank's partial rows [R, D] over columns o_d (just written by this program) into slot
    `rank` of every peer's mailbox [2, TP, R, D] fp32, the half of this launch's parity (a peer may still read
    the other half: no rank is more than one launch ahead of another)."""
    tl.debug_barrier()  # this program's stores of `mine` before it reads them back
    off = (epoch % 2) * TP * R * D + rank * R * D
    for r in range(R):
        x = tl.load(mine + r * D + o_d, mask=o_d < D, other=0.0)
        push_to_peers(x, peer_slots, off + r * D, rank, o_d, o_d < D, TP)


@triton.jit
def push_tag(peer_flags, arrive, epoch, rank, n_tasks, n_pushers, mute, TP: tl.constexpr, INTERPRET: tl.constexpr):
    """Real ranks: the last of this launch's `n_pushers` tasks to push its rows (`arrive_last`) writes this
    rank's tag, the epoch, into its word of every peer's flags (after the peer's task words: this rank's place
    among that peer's peers), with a release at system scope, so a peer that sees it sees every pushed row.
    `mute` 1: it never does (fault injection: the peer that never publishes)."""
    fence_sys(INTERPRET)  # this thread's pushed rows, at system scope, before its arrival
    tl.debug_barrier()
    if arrive_last(arrive, epoch, n_pushers):
        if mute == 0:
            for q in range(TP):
                if q != rank:
                    words = tl.load(peer_flags + q).to(tl.pointer_type(tl.int32))
                    slot = tl.where(rank < q, rank, rank - 1)
                    tl.atomic_xchg(words + n_tasks + slot, epoch, sem="release", scope="sys")
