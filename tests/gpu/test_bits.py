"""The GPU tier: what only a GPU can prove, at glm53_flash's per-rank sizes. Run on a GPU machine with
`TRITON_INTERPRET=0 python -m pytest -q -m gpu` (an ordinary run skips it where torch sees no CUDA device; asked
for, a tier that cannot run fails, and so does a test of it that skips: tests/conftest.py).

- A CUDA graph of a launch, replayed, gives the bits of the launch run eagerly (the tag in device memory:
  no host reset between replays).
- The separate-launches baseline gives the persistent launch's bits.
- Every value of every schedule knob gives the default's bits, the compile options (`stages`, `maxnreg`) and
  what runs only as inline asm on a GPU (`poll`, `prefetch`) included: the interpreter cannot tell them apart.
"""

import os

import pytest
import torch

from glm53ctl.kernels.checks import make_harness
from glm53ctl.kernels.kinds import kernel_kinds
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights
from glm53ctl.tuning.knobs import kind_knobs
from tests.helpers import assert_same_bits, resolved

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the GPU tier runs compiled kernels"),
]
TP, ROWS = 4, 2  # rows 2: dense and tail fold their norms and make mix tasks; TP 4: every peer path


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("glm53_flash"), seed=0, device="cuda")


def _key(weights, kind: str, **knobs):
    k = make_harness(weights, resolved(kind, TP, ROWS, knobs, "cuda", model="glm53_flash"))
    x = k.inputs(seed=3)[0].to("cuda")
    return k, x, k.peer_partials(x)


def _clone(out: dict) -> dict:
    return {n: t.clone() for n, t in out.items()}


@pytest.mark.parametrize("kind", kernel_kinds())
def test_graph_replay_gives_the_eager_bits(weights, kind):
    k, x, peers = _key(weights, kind)
    eager = _clone(k(x, peers, poison=True))
    k(x, peers, poison=True, check=False)  # warm: nothing is compiled or allocated first inside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # the poison too: every replay starts from NaN, so one that wrote nothing fails
        out = k(x, peers, poison=True, check=False)
    epoch = k.launch.runtime.epoch
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    k.launch.runtime.check()  # no fault in any replay
    assert k.launch.runtime.epoch == epoch + 3
    assert_same_bits(eager, out, "graph replay")


@pytest.mark.parametrize("kind", kernel_kinds())
def test_separate_launches_give_the_persistent_bits(weights, kind):
    k, x, peers = _key(weights, kind)
    whole = _clone(k(x, peers, poison=True))
    assert_same_bits(whole, _clone(k.separate()(x, peers, poison=True)), "separate launches")


def _schedule_variants(kind: str) -> list[tuple[str, object]]:
    out = [("grid", g) for g in (132, 264)]
    for knob in kind_knobs(kind).values():
        if knob.cls == "schedule" and knob.name != "grid":
            out += [(knob.name, v) for v in knob.values if v != knob.default]
    return out


@pytest.mark.parametrize("kind", kernel_kinds())
def test_every_schedule_knob_is_bitwise_equal_on_the_gpu(weights, kind):
    k, x, peers = _key(weights, kind)
    base = _clone(k(x, peers, poison=True))
    names = {name for name, _ in _schedule_variants(kind)}
    assert {"poll", "grid", "handoff", "launch"} <= names and (kind == "embed" or "stages" in names)
    assert kind not in ("dense", "kda", "sparse") or "prefetch" in names
    for name, value in _schedule_variants(kind):
        other, _, _ = _key(weights, kind, **{name: value})
        assert_same_bits(base, _clone(other(x, peers, poison=True)), f"{kind} {name}={value}")
