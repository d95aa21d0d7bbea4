"""Task types of every launch kind, in one id space.

A task table row starts with its type; a kernel dispatches on it. One id space across kinds lets one table
hold tasks of several kinds (the whole step: embed, the layers, the tail) and lets a trace or a fault name a
task without knowing which launch it came from. Device code compares against these names (`tl.constexpr`
globals); the host adds tasks with them. Ids are never reused: a new kind appends its types.

An id is a constant in the kernel's code, and its value can change the code: `embed`'s branch on its gather
type compiled to other code as `ttype == 1` than as `ttype == 0` (8 fewer registers, and on the H200 8.0 µs
against 7.1 at TP8 rows 1, docs/perf/embed.md). Embed keeps 0 and 1, the ids it was measured with; a kind's
ids changed is a change to time (`build --against` shows whether its code changed at all).
"""

import triton.language as tl

_TYPES = (
    # embed
    ("EMBED_GATHER", "embed gather"),
    ("EMBED_REDUCE", "embed reduce"),
    # the runtime's own: a no-op hand-off (runtime/chain.py)
    ("HOP", "hop"),
    # tail
    ("TAIL_NORM", "final norm"),
    ("TAIL_LM_HEAD", "lm_head"),
    ("TAIL_GATHER", "logits gather"),
    # dense (and the attention half of kda)
    ("MIX_A", "attn mix"),
    ("GATE_A", "attn gate"),
    ("COMB_A", "attn comb"),
    ("INPROJ", "in_proj"),
    ("KDA_HEAD", "kda head"),
    ("OPROJ", "o_proj"),
    ("RED_A", "attn reduce"),
    ("OWN_A", "attn partial"),
    ("MIX_F", "ffn mix"),
    ("GATE_F", "ffn gate"),
    ("COMB_F", "ffn comb"),
    ("GU", "gate_up"),
    ("DOWN", "down_proj"),
    ("RED_F", "ffn reduce"),
    ("OWN_F", "ffn partial"),
    # the MoE (kda, and sparse's FFN half)
    ("ROUTER", "router"),
    ("ROUTE", "route"),
    ("EXP_GU", "expert gate_up"),
    ("EXP_DOWN", "expert down"),
    ("MOE_SUM", "moe sum"),  # retired: the FFN reduces sum the slots themselves; ids are never reused
    # sparse's attention half: MLA with the k-pool DSA indexer
    ("MLA_A", "mla a_proj"),
    ("MLA_ROW", "mla row"),
    ("MLA_QB", "mla q_b"),
    ("ABSORB", "mla absorb"),
    ("SCORE", "index scores"),
    ("SELECT", "index select"),
    ("ATTN", "mla attention"),
    ("COMBINE", "mla combine"),
    ("WUV", "mla w_uv"),
    ("SEL_PASS", "index select pass"),
)

# id -> the name a trace or a LaunchFault shows
TYPE_NAMES = {i: name for i, (_, name) in enumerate(_TYPES)}

EMBED_GATHER = tl.constexpr(0)
EMBED_REDUCE = tl.constexpr(1)
HOP = tl.constexpr(2)
TAIL_NORM = tl.constexpr(3)
TAIL_LM_HEAD = tl.constexpr(4)
TAIL_GATHER = tl.constexpr(5)
MIX_A = tl.constexpr(6)
GATE_A = tl.constexpr(7)
COMB_A = tl.constexpr(8)
INPROJ = tl.constexpr(9)
KDA_HEAD = tl.constexpr(10)
OPROJ = tl.constexpr(11)
RED_A = tl.constexpr(12)
OWN_A = tl.constexpr(13)
MIX_F = tl.constexpr(14)
GATE_F = tl.constexpr(15)
COMB_F = tl.constexpr(16)
GU = tl.constexpr(17)
DOWN = tl.constexpr(18)
RED_F = tl.constexpr(19)
OWN_F = tl.constexpr(20)
ROUTER = tl.constexpr(21)
ROUTE = tl.constexpr(22)
EXP_GU = tl.constexpr(23)
EXP_DOWN = tl.constexpr(24)
MOE_SUM = tl.constexpr(25)
MLA_A = tl.constexpr(26)
MLA_ROW = tl.constexpr(27)
MLA_QB = tl.constexpr(28)
ABSORB = tl.constexpr(29)
SCORE = tl.constexpr(30)
SELECT = tl.constexpr(31)
ATTN = tl.constexpr(32)
COMBINE = tl.constexpr(33)
WUV = tl.constexpr(34)
SEL_PASS = tl.constexpr(35)
