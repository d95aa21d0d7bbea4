"""Run in a fresh process (not under the interpreter): one key's launches through Triton's own JIT for an sm_90
target with no GPU. The active driver knows its target and nothing else, and each launch warms up instead of
launching, so the JIT binds and specializes the harness's real arguments, derives its keys, and compiles or (with
a kernel cache) loads, as it would on the GPU. Prints what each key loaded and compiled, as JSON.

    python tests/kernels/jit_probe.py CACHE|- KIND:TP:ROWS ...
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class TargetOnly:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def main(cache: str, keys: list[str]) -> None:
    driver.set_active(TargetOnly())
    from glm53ctl.kernels import kernel_cache
    from glm53ctl.kernels.build import for_build
    from glm53ctl.kernels.checks import make_harness
    from glm53ctl.kernels.runtime.launch import PersistentLaunch
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights
    from glm53ctl.tuning.knobs import resolve_key

    def warm(self, args, check):  # what PersistentLaunch.launch hands the JIT, warmed up instead of launched
        self.kernel.warmup(**args, **self.constexprs(), **self.options(), grid=(self.grid,))

    PersistentLaunch.launch = warm
    kernel_cache.activate(None if cache == "-" else Path(cache))
    weights = Weights(load_model("tiny"), seed=0, device="cpu")
    # tensors on the CPU, the grid a GPU's (as the build's)
    on_cpu = lambda k: replace(k, device="cpu", parts=tuple(on_cpu(p) for p in k.parts))  # noqa: E731
    with kernel_cache.tallied() as so_far:
        for text in keys:
            kind, tp, rows = text.split(":")
            key = on_cpu(for_build(resolve_key("tiny", kind, int(tp), int(rows))))
            with kernel_cache.counting(key.name):
                k = make_harness(weights, key)
                x = k.inputs(0)[0]
                k(x, k.peer_partials(x))
        print(json.dumps({n: c.as_dict() for n, c in so_far().items()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
