"""Small Triton helpers shared by the launch kinds."""

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    """Whether kernels run in Triton's interpreter (TRITON_INTERPRET=1, read before kernels are defined)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


# before any kernel runs: glm53ctl's settings of the interpreter (GLM53CTL_INTERPRETER=stock: as Triton ships it)
if interpreting() and os.environ.get("GLM53CTL_INTERPRETER") != "stock":
    from glm53ctl.kernels import interpreter

    interpreter.configure()
elif not interpreting():  # a worker process: the kernel cache and the compile counts its parent activated
    from glm53ctl.kernels import kernel_cache

    kernel_cache.from_env()


def pinned(module: str):
    """Name a noinline Triton function as if defined in `module`. Triton names a noinline function's symbol by
    the module it is defined in, and ptxas allocates a 255-register layer kernel's registers differently for
    other names (docs/perf/path/2026-12-07-ptx-identity.md: a file move alone made `kda` 2.3% slower on an H100).
    A pinned name keeps a body's cubin when its file moves; the layer's task bodies keep the paths they had when
    last measured (4b73d9f). Every noinline function has one (tests/kernels/test_symbols.py)."""

    def pin(fn):
        fn.__module__ = module
        return fn

    return pin


@triton.jit
def to_bf16(x, INTERPRET: tl.constexpr):
    """fp32 -> bf16, round to nearest even everywhere: the interpreter's cast truncates, the GPU's rounds."""
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)
