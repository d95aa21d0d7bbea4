"""Run in a fresh process, outside the interpreter: compile for sm_90 on this CPU a kernel that calls a noinline
function NAME (in this project's namespace, so its mangled name is in the cubin) multiplying by SCALE, and write
its cubin to OUT.

    python tests/cli/sass_probe.py NAME SCALE OUT
"""

import sys
import textwrap
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

name, scale, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
src = textwrap.dedent(f"""
    import triton
    import triton.language as tl

    @triton.jit(noinline=True)
    def {name}(x, out):
        tl.store(out, tl.load(x) * {scale})

    @triton.jit
    def probe(x, out):
        {name}(x, out)
    """)
path = out.with_suffix(".py")
path.write_text(src)  # Triton reads a jit function's source from its file
scope = {"__name__": "glm53ctl.kernels.probe"}
exec(compile(src, str(path), "exec"), scope)
source = ASTSource(fn=scope["probe"], signature={"x": "*i32", "out": "*i32"})
out.write_bytes(triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"])
