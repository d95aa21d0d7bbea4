"""The `dense` kernel: the claim loop over the layer's tasks (table.py) and the dispatch to their bodies
(tasks.py). Knob `oproj_first` lives here: a KDA task publishes (its head's z, if it arrived last) and leaves
its step (decay, k, delta: 3 vectors) in scratch; its program runs its next task (an o_proj tile, as the table
orders them), then recomputes the new recurrent state from S_in with the same operations (the same bits) and
writes both states back.
"""

import triton
import triton.language as tl

from glm53ctl.kernels.kinds.dense.mla import (
    task_attn,
    task_combine,
    task_head_gemv,
    task_mla_row,
    task_qb,
    task_score,
    task_select,
)
from glm53ctl.kernels.kinds.dense.tasks import (
    PR,
    prefetch,
    task_expert_gate_up,
    task_gate,
    task_gate_up,
    task_inproj,
    task_kda,
    task_mix,
    task_own,
    task_partial,
    task_reduce,
    task_route,
)
from glm53ctl.kernels.kinds.task_types import (
    ABSORB,
    ATTN,
    COMB_A,
    COMB_F,
    COMBINE,
    DOWN,
    EXP_DOWN,
    EXP_GU,
    GATE_A,
    GATE_F,
    GU,
    INPROJ,
    KDA_HEAD,
    MIX_A,
    MIX_F,
    MLA_A,
    MLA_QB,
    MLA_ROW,
    OPROJ,
    OWN_A,
    OWN_F,
    RED_A,
    RED_F,
    ROUTE,
    ROUTER,
    SCORE,
    SELECT,
    WUV,
)
from glm53ctl.kernels.ops.ffn.moe import router_tile, task_expert_down
from glm53ctl.kernels.ops.kda.kernel import kda_write_state
from glm53ctl.kernels.runtime.device import (
    finish,
    launch_epoch,
    next_task,
    pdl_enter,
    publish,
    runtime_buffers,
    stamp,
    task_row,
    wait_task,
)


@triton.jit(do_not_specialize=["stuck_site", "budget_ns", "RANK", "n_tasks", "n_peers", "n_programs"])
def dense_kernel(
    ctl,
    flags,
    boxes,
    errs,
    tasks,
    wait_kind,
    wait_index,
    wait_count,
    pub_slot,
    # inputs and weights
    H,
    fn_a,
    base_a,
    scale_a,
    norm_a,
    fn_f,
    base_f,
    scale_f,
    norm_f,
    w_in,
    w_fb,
    w_gb,
    conv_w,
    A_log,
    dt_bias,
    o_norm,
    w_o,
    w_gate,
    w_up,
    w_down,
    conv_in,
    S_in,
    # writes
    conv_out,
    S_out,
    # hand-off buffers
    mixp,
    ssp,
    y_in,
    lr,
    z,
    kscr,
    arrive,
    kpart_a,
    parts_a,
    act,
    kpart_f,
    parts_f,
    pr,
    ipp,
    gup,
    trace,
    # the MoE (kda): router, experts stacked [E + 1, ...] (the shared one last); routing and slot buffers
    w_r,
    r_bias,
    w_eg,
    w_eu,
    w_ed,
    logits,
    ids,
    wts,
    route_on,
    slots,
    n_slots,
    slot_of,
    gup_m,
    act_m,
    y_m,
    # sparse's attention half (MLA): the caches (written at pos only), weights, hand-off buffers (mla.py)
    latent,
    index_key,
    index_gate,
    pooled,
    pos,
    w_a,
    q_norm,
    kv_norm,
    k_w,
    k_b,
    ape,
    w_qb,
    w_ukt,
    w_uv,
    y_a,
    qr,
    wi,
    q_mla,
    qi,
    q_lat,
    scores,
    idx,
    part_o,
    part_m,
    part_l,
    o_lat,
    o_mla,
    ln_eps,
    mla_scale,
    # outputs
    x_hat_a,
    post_a,
    comb_a,
    attn,
    H1,
    x_hat_f,
    post_f,
    comb_f,
    ffn_out,
    H2,
    R,
    RANK,
    hc_eps,
    norm_eps,
    lower_bound,
    n_tasks,
    n_peers,
    n_programs,
    stuck_site,
    budget_ns,
    D: tl.constexpr,
    HC: tl.constexpr,
    ITERS: tl.constexpr,
    HL: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    RG: tl.constexpr,
    I: tl.constexpr,
    T: tl.constexpr,
    CH: tl.constexpr,
    NCH: tl.constexpr,
    KS_O: tl.constexpr,
    KS_F: tl.constexpr,
    KS_GU: tl.constexpr,
    KS_IN: tl.constexpr,
    BN: tl.constexpr,
    BN_GU: tl.constexpr,
    BN_O: tl.constexpr,
    BK_D: tl.constexpr,
    BK_R: tl.constexpr,
    BK_O: tl.constexpr,
    BK_I: tl.constexpr,
    BK_GU: tl.constexpr,
    BK_IN: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
    OPROJ_FIRST: tl.constexpr,
    PREFETCH: tl.constexpr,
    FOLD: tl.constexpr,
    M: tl.constexpr,
    TRACE: tl.constexpr,
    NV: tl.constexpr,
    MIX_TASK: tl.constexpr,
    PDL: tl.constexpr,
    MOE: tl.constexpr = False,
    E: tl.constexpr = 1,
    E_ALL: tl.constexpr = 1,
    TOPK: tl.constexpr = 1,
    SCALE: tl.constexpr = 1.0,
    NSLOT: tl.constexpr = 1,
    BLOCK_E: tl.constexpr = 32,
    KS_RT: tl.constexpr = 1,
    BK_RT: tl.constexpr = 16,
    BN_DN: tl.constexpr = 16,
    MLA: tl.constexpr = False,
    HQ: tl.constexpr = 1,
    NOPE: tl.constexpr = 16,
    V: tl.constexpr = 16,
    C: tl.constexpr = 16,
    QL: tl.constexpr = 16,
    QLP: tl.constexpr = 16,
    IH: tl.constexpr = 16,
    HI: tl.constexpr = 1,
    KP: tl.constexpr = 1,
    WIDTH: tl.constexpr = 1,
    TOPP: tl.constexpr = 1,
    LMAX: tl.constexpr = 1,
    NA: tl.constexpr = 16,
    NQB: tl.constexpr = 16,
    BP: tl.constexpr = 16,
    TB: tl.constexpr = 16,
    NB: tl.constexpr = 1,
    HB: tl.constexpr = 16,
    HBI: tl.constexpr = 16,
    BN_AB: tl.constexpr = 16,
    BN_UV: tl.constexpr = 16,
    BK_A: tl.constexpr = 16,
    BK_QB: tl.constexpr = 16,
    BK_C: tl.constexpr = 16,
    BK_NOPE: tl.constexpr = 16,
    SEL_BLOCK: tl.constexpr = 16,
):
    P: tl.constexpr = HQ * V if MLA else HL * K  # what o_proj reads: MLA's heads' values, or KDA's z
    NIN: tl.constexpr = 2 * RG + HL + 3 * P
    HDR: tl.constexpr = 2 * RG + HL  # where the per-head q|k|v rows start in the in-projection
    PK: tl.constexpr = P // KS_O
    IK: tl.constexpr = I // KS_F
    moe = (y_m, ids, wts, slot_of)  # what an FFN reduce of the MoE sums (tasks.py `_own`)
    attn_o = z  # what o_proj reads: the KDA heads' z, or (MLA) the heads' W_UV outputs
    if MLA:
        attn_o = o_mla
    rt = runtime_buffers(ctl, flags, boxes, errs, tasks, wait_kind, wait_index, wait_count, pub_slot)
    if PDL:  # a stage of separate-pdl: ask for this program's first weights while the launch before ends
        first = task_row(rt, tl.minimum(tl.program_id(0), n_tasks - 1))
        prefetch(
            ttype=first[0],
            a0=first[1],
            a1=first[2],
            a2=first[3],
            w_fb=w_fb,
            w_gb=w_gb,
            fn_f=fn_f,
            w_in=w_in,
            w_gate=w_gate,
            w_up=w_up,
            w_o=w_o,
            w_down=w_down,
            S_in=S_in,
            D=D,
            HL=HL,
            K=K,
            RG=RG,
            I=I,
            P=P,
            PK=PK,
            IK=IK,
            BN=BN,
            BN_GU=BN_GU,
            BN_O=BN_O,
            HC=HC,
            CH=CH,
            NV=NV,
            KS_IN=KS_IN,
            KS_GU=KS_GU,
            WHICH=1,
            MIX_TASK=MIX_TASK,
        )
        pdl_enter(INTERPRET)
    epoch = launch_epoch(ctl, INTERPRET)
    n_done = 0
    # oproj_first: the KDA head whose states this program still has to write back
    pend = 0
    pend_r = 0
    pend_h = 0
    pend_p = 0
    task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET)
    while task >= 0:
        row = task_row(rt, task)
        ttype, a0, a1 = row[0], row[1], row[2]
        if TRACE:
            stamp(trace, task, 0, INTERPRET)
        if PREFETCH and not INTERPRET:  # the interpreter has no inline asm; a prefetch changes no bits
            prefetch(
                ttype=ttype,
                a0=a0,
                a1=a1,
                a2=row[3],
                w_fb=w_fb,
                w_gb=w_gb,
                fn_f=fn_f,
                w_in=w_in,
                w_gate=w_gate,
                w_up=w_up,
                w_o=w_o,
                w_down=w_down,
                S_in=S_in,
                D=D,
                HL=HL,
                K=K,
                RG=RG,
                I=I,
                P=P,
                PK=PK,
                IK=IK,
                BN=BN,
                BN_GU=BN_GU,
                BN_O=BN_O,
                HC=HC,
                CH=CH,
                NV=NV,
                KS_IN=KS_IN,
                KS_GU=KS_GU,
                WHICH=PREFETCH,
                MIX_TASK=MIX_TASK,
            )
        # a task's early sites; its late ones (a folded INPROJ's gates, a KDA head's other parts) in its body
        ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, False)
        if TRACE:
            stamp(trace, task, 1, INTERPRET)
        if ok:
            if ttype == MIX_A:
                task_mix(
                    H=H,
                    fn=fn_a,
                    mixp=mixp,
                    ssp=ssp,
                    c=a0,
                    r=a1,
                    D=D,
                    HC=HC,
                    CH=CH,
                )
            elif (ttype == GATE_A) | (ttype == COMB_A):
                task_gate(
                    mixp=mixp,
                    ssp=ssp,
                    H=H,
                    base=base_a,
                    scale=scale_a,
                    norm_w=norm_a,
                    x_hat=x_hat_a,
                    post=post_a,
                    comb=comb_a,
                    pr=pr,
                    r=a0,
                    comb_task=ttype == COMB_A,
                    hc_eps=hc_eps,
                    norm_eps=norm_eps,
                    D=D,
                    HC=HC,
                    ITERS=ITERS,
                    NCH=NCH,
                    INTERPRET=INTERPRET,
                )
            elif ttype == INPROJ:
                ok = task_inproj(
                    rt=rt,
                    row=row,
                    task=task,
                    epoch=epoch,
                    stuck_site=stuck_site,
                    budget_ns=budget_ns,
                    trace=trace,
                    x=H if FOLD else x_hat_a,
                    w_in=w_in,
                    pr=pr,
                    ipp=ipp,
                    y_in=y_in,
                    lr=lr,
                    n0=a0,
                    ks=a1,
                    R=R,
                    D=D,
                    HC=HC,
                    NIN=NIN,
                    RG=RG,
                    BN=BN,
                    BK=BK_IN,
                    M=M,
                    KS=KS_IN,
                    FOLD=FOLD,
                    TRACE=TRACE,
                    INTERPRET=INTERPRET,
                    POLL=POLL,
                    THREADS=THREADS,
                )
            elif ttype == KDA_HEAD:
                task_kda(
                    epoch=epoch,
                    y_in=y_in,
                    lr=lr,
                    w_fb=w_fb,
                    w_gb=w_gb,
                    conv_in=conv_in,
                    conv_out=conv_out,
                    conv_w=conv_w,
                    A_log=A_log,
                    dt_bias=dt_bias,
                    o_norm=o_norm,
                    S_in=S_in,
                    S_out=S_out,
                    z=z,
                    kscr=kscr,
                    arrive=arrive,
                    h=a0,
                    r=a1,
                    part=row[3],
                    R=R,
                    lower_bound=lower_bound,
                    eps=norm_eps,
                    HL=HL,
                    K=K,
                    W=W,
                    RG=RG,
                    BK_R=BK_R,
                    NV=NV,
                    INTERPRET=INTERPRET,
                    WRITE_STATE=not OPROJ_FIRST,
                )
            elif ttype == OPROJ:
                task_partial(
                    x=attn_o + a1 * PK,
                    w=w_o + a1 * PK,
                    out=kpart_a + a1 * R * D,
                    n0=a0,
                    R=R,
                    N=D,
                    K=PK,
                    STRIDE=P,
                    BN=BN_O,
                    BK=BK_O,
                    INTERPRET=INTERPRET,
                )
            elif ttype == DOWN:
                task_partial(
                    x=act + a1 * IK,
                    w=w_down + a1 * IK,
                    out=kpart_f + a1 * R * D,
                    n0=a0,
                    R=R,
                    N=D,
                    K=IK,
                    STRIDE=I,
                    BN=BN_O,
                    BK=BK_I,
                    INTERPRET=INTERPRET,
                )
            elif ttype == RED_A:
                task_reduce(
                    kpart=kpart_a,
                    parts=parts_a,
                    out=attn,
                    H=H,
                    post=post_a,
                    comb=comb_a,
                    H_out=H1,
                    fn=fn_f,
                    mixp=mixp + NCH * 16 * 32,
                    ssp=ssp + NCH * 16,
                    moe=moe,
                    c=a0,
                    r=a1,
                    R=R,
                    RANK=RANK,
                    D=D,
                    HC=HC,
                    CH=CH,
                    KS=KS_O,
                    T=T,
                    MIX=not MIX_TASK,
                    MOE=False,
                    TOPK=TOPK,
                    NSLOT=NSLOT,
                    INTERPRET=INTERPRET,
                )
            elif ttype == MIX_F:
                task_mix(
                    H=H1,
                    fn=fn_f,
                    mixp=mixp + NCH * 16 * 32,
                    ssp=ssp + NCH * 16,
                    c=a0,
                    r=a1,
                    D=D,
                    HC=HC,
                    CH=CH,
                )
            elif (ttype == GATE_F) | (ttype == COMB_F):
                task_gate(
                    mixp=mixp + NCH * 16 * 32,
                    ssp=ssp + NCH * 16,
                    H=H1,
                    base=base_f,
                    scale=scale_f,
                    norm_w=norm_f,
                    x_hat=x_hat_f,
                    post=post_f,
                    comb=comb_f,
                    pr=pr + 16 * PR,
                    r=a0,
                    comb_task=ttype == COMB_F,
                    hc_eps=hc_eps,
                    norm_eps=norm_eps,
                    D=D,
                    HC=HC,
                    ITERS=ITERS,
                    NCH=NCH,
                    INTERPRET=INTERPRET,
                )
            elif ttype == GU:
                ok = task_gate_up(
                    rt=rt,
                    row=row,
                    task=task,
                    epoch=epoch,
                    stuck_site=stuck_site,
                    budget_ns=budget_ns,
                    trace=trace,
                    x=H1 if FOLD else x_hat_f,
                    w_gate=w_gate,
                    w_up=w_up,
                    pr=pr + 16 * PR,
                    gup=gup,
                    act=act,
                    n0=a0,
                    ks=a1,
                    R=R,
                    D=D,
                    HC=HC,
                    I=I,
                    BN=BN_GU,
                    BK=BK_GU,
                    LIMIT=LIMIT,
                    M=M,
                    KS=KS_GU,
                    FOLD=FOLD,
                    TRACE=TRACE,
                    INTERPRET=INTERPRET,
                    POLL=POLL,
                    THREADS=THREADS,
                )
            elif ttype == RED_F:
                task_reduce(
                    kpart=kpart_f,
                    parts=parts_f,
                    out=ffn_out,
                    H=H1,
                    post=post_f,
                    comb=comb_f,
                    H_out=H2,
                    fn=fn_f,
                    mixp=mixp,
                    ssp=ssp,
                    moe=moe,
                    c=a0,
                    r=a1,
                    R=R,
                    RANK=RANK,
                    D=D,
                    HC=HC,
                    CH=CH,
                    KS=KS_F,
                    T=T,
                    MIX=False,
                    MOE=MOE,
                    TOPK=TOPK,
                    NSLOT=NSLOT,
                    INTERPRET=INTERPRET,
                )
            elif ttype == OWN_A:
                task_own(
                    kpart=kpart_a,
                    parts=parts_a,
                    moe=moe,
                    c=a0,
                    r=a1,
                    R=R,
                    RANK=RANK,
                    D=D,
                    CH=CH,
                    KS=KS_O,
                    MOE=False,
                    TOPK=TOPK,
                    NSLOT=NSLOT,
                )
            elif ttype == OWN_F:
                task_own(
                    kpart=kpart_f,
                    parts=parts_f,
                    moe=moe,
                    c=a0,
                    r=a1,
                    R=R,
                    RANK=RANK,
                    D=D,
                    CH=CH,
                    KS=KS_F,
                    MOE=MOE,
                    TOPK=TOPK,
                    NSLOT=NSLOT,
                )
            if MLA:  # sparse's attention half: none in a KDA layer's table, so its build has none of this code
                if ttype == MLA_A:
                    task_partial(
                        x=x_hat_a, w=w_a, out=y_a, n0=a0, R=R, N=NA, K=D, STRIDE=D, BN=BN, BK=BK_A, INTERPRET=INTERPRET
                    )
                elif ttype == MLA_ROW:
                    task_mla_row(
                        y_a=y_a,
                        qr=qr,
                        wi=wi,
                        caches=(latent, index_key, index_gate, pooled),
                        norms=(q_norm, kv_norm, k_w, k_b, ape),
                        pos=pos,
                        r=a0,
                        eps=norm_eps,
                        ln_eps=ln_eps,
                        QL=QL,
                        QLP=QLP,
                        C=C,
                        IH=IH,
                        HI=HI,
                        KP=KP,
                        LMAX=LMAX,
                        INTERPRET=INTERPRET,
                    )
                elif ttype == MLA_QB:
                    task_qb(qr, w_qb, q_mla, qi, a0, R, QL, HQ * NOPE, NQB, BN, BK_QB, INTERPRET)
                elif ttype == ABSORB:
                    task_head_gemv(q_mla, w_ukt, q_lat, a0, a1, R, HQ, C, NOPE, BN_AB, BK_NOPE, INTERPRET)
                elif ttype == SCORE:
                    task_score(qi, wi, pooled, scores, pos, a0, a1, HI, IH, KP, LMAX, BP, HBI, INTERPRET)
                elif ttype == SELECT:
                    task_select(scores, idx, pos, a0, KP, TOPP, WIDTH, LMAX, SEL_BLOCK)
                elif ttype == ATTN:
                    task_attn(
                        q_lat, latent, idx, (part_o, part_m, part_l), a0, a1, row[3], mla_scale, HQ, C, WIDTH, NB,
                        TB, HB, LMAX, INTERPRET,
                    )  # fmt: skip
                elif ttype == COMBINE:
                    task_combine((part_o, part_m, part_l), o_lat, a0, a1, HQ, C, NB, HB, INTERPRET)
                elif ttype == WUV:
                    task_head_gemv(o_lat, w_uv, o_mla, a0, a1, R, HQ, V, C, BN_UV, BK_C, INTERPRET)
            if MOE:  # the MoE's tasks (kda): none in a dense table, so a dense build has none of this code
                if ttype == ROUTER:
                    router_tile(x_hat_f, w_r, logits, a0, a1, R, E, D, KS_RT, BLOCK_E, BK_RT, INTERPRET)
                elif ttype == ROUTE:
                    task_route(
                        logits=logits,
                        bias=r_bias,
                        ids=ids,
                        wts=wts,
                        on=route_on,
                        slots=slots,
                        n_slots=n_slots,
                        slot_of=slot_of,
                        arrive=arrive + R * HL,
                        epoch=epoch,
                        r=a0,
                        R=R,
                        E=E,
                        KS=KS_RT,
                        BLOCK_E=E_ALL,
                        TOPK=TOPK,
                        SCALE=SCALE,
                        NSLOT=NSLOT,
                    )
                elif ttype == EXP_GU:
                    ok = task_expert_gate_up(
                        rt=rt,
                        row=row,
                        task=task,
                        epoch=epoch,
                        stuck_site=stuck_site,
                        budget_ns=budget_ns,
                        trace=trace,
                        x=x_hat_f,
                        w_gate=w_eg,
                        w_up=w_eu,
                        gup=gup_m,
                        act=act_m,
                        slots=slots,
                        n_slots=n_slots,
                        j=a0,
                        n0=a1,
                        ks=row[3],
                        R=R,
                        E=E,
                        I=I,
                        D=D,
                        NSLOT=NSLOT,
                        BN=BN_GU,
                        BK=BK_GU,
                        LIMIT=LIMIT,
                        KS=KS_GU,
                        TRACE=TRACE,
                        INTERPRET=INTERPRET,
                        POLL=POLL,
                        THREADS=THREADS,
                    )
                elif ttype == EXP_DOWN:
                    task_expert_down(
                        act_m, w_ed, y_m, slots, n_slots, a0, a1, R, E, I, D, NSLOT, BN_DN, BK_I, INTERPRET
                    )
            if ok:
                publish(rt, row, task, epoch, INTERPRET)
                if TRACE:
                    stamp(trace, task, 2, INTERPRET)
        if OPROJ_FIRST:
            # a KDA head of an earlier task: its states now, after the task that followed it (o is out, that
            # task's loads issued); then this task's head, if it is one, waits for the next task
            if pend != 0:
                kda_write_state(
                    scr=kscr,
                    u=y_in + HDR,
                    u_row=NIN,
                    u_part=K,
                    u_head=3 * K,
                    conv_in=conv_in,
                    conv_out=conv_out,
                    S_in=S_in,
                    S_out=S_out,
                    r=pend_r,
                    h=pend_h,
                    part=pend_p,
                    H=HL,
                    K=K,
                    W=W,
                    NV=NV,
                    INTERPRET=INTERPRET,
                )
                pend = 0
            if (ttype == KDA_HEAD) & ok:
                pend = 1
                pend_h = a0
                pend_r = a1
                pend_p = row[3]
        n_done += 1
        task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok)
    if OPROJ_FIRST:
        if pend != 0:
            kda_write_state(
                scr=kscr,
                u=y_in + HDR,
                u_row=NIN,
                u_part=K,
                u_head=3 * K,
                conv_in=conv_in,
                conv_out=conv_out,
                S_in=S_in,
                S_out=S_out,
                r=pend_r,
                h=pend_h,
                part=pend_p,
                H=HL,
                K=K,
                W=W,
                NV=NV,
                INTERPRET=INTERPRET,
            )
    finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)
