"""glm53ctl's settings of Triton's interpreter (TRITON_INTERPRET=1: CI, and the main job on a CPU), which make a
launch about 2.5x faster than the interpreter as shipped and give the same bits (tests/kernels/test_launches.py):
the language patched once per launch, not on every call of a jitted function, and the integer-overflow check
computed only under TRITON_DEBUG=1, which (unlike the interpreter as shipped, which computes it always and never
acts on it) then also makes it and every device assert act."""

from contextlib import contextmanager

import triton.language as tl


def _patch_language_once_per_launch() -> None:
    """Triton 3.6's interpreter patches `triton.language` for every launch (and restores it after), and again on
    every call of a jitted function inside it, never restored: the same patches over the same modules, about a
    millisecond each, a quarter of a `check` on the CPU (task bodies and `tl.sum` are such calls). Inside a launch,
    a call whose modules (`tl`, or `triton.language.core` for the standard library) were patched already in it
    skips them. Semantics are unchanged: every patch binds the one interpreter builder, and the skipped ones would
    have stayed in force anyway. (A Triton without these internals is left as it is.)"""
    import inspect
    import weakref

    from triton.runtime import interpreter as ti

    if getattr(ti, "_glm53ctl_once_per_launch", False) or not all(
        hasattr(ti, n) for n in ("_patch_lang", "_LangPatchScope", "GridExecutor", "InterpretedFunction")
    ):
        return
    patch = ti._patch_lang
    covered: list[set[int]] = []  # per launch in progress: the language modules patched in it
    langs = (tl, tl.core)

    modules: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per function: the language modules it sees

    def seen(fn) -> frozenset[int]:
        found = modules.get(fn)
        if found is None:
            found = modules[fn] = frozenset(
                id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs
            )
        return found

    def patch_lang(fn):
        if covered and seen(fn) and seen(fn) <= covered[-1]:  # (one that sees none: the stock assert says so)
            return ti._LangPatchScope()  # a call inside a launch: the patches it would make are in force
        scope = patch(fn)
        if covered:  # the launch's own patches, or a call's over another module (triton.language.core: tl.sum)
            covered[-1] |= seen(fn)
        return scope

    launch = ti.GridExecutor.__call__

    def run(self, *args, **kwargs):
        covered.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            covered.pop()

    ti._glm53ctl_stock = (patch, launch)  # for `interpreter_as_shipped`
    ti._patch_lang = patch_lang
    ti.GridExecutor.__call__ = run
    ti._glm53ctl_once_per_launch = True


def set_checks(sanitize: bool, debug: bool) -> tuple[bool, bool]:
    """The interpreter's integer-overflow check on every integer operation (`sanitize_overflow`) and whether its
    asserts act (`debug`); returns the previous pair. As shipped: the check always computed, about a third of a
    launch's time, and never acted on (Triton 3.6 never sets the interpreter's `debug`, whatever TRITON_DEBUG
    says)."""
    from dataclasses import replace

    from triton.runtime import interpreter as ti

    builder = ti.interpreter_builder
    before = (builder.options.sanitize_overflow, builder.options.debug)
    builder.options = replace(builder.options, sanitize_overflow=sanitize, debug=debug)
    return before


@contextmanager
def interpreter_as_shipped():
    """Triton's interpreter as it comes (every patch on every call, the overflow check on), for as long as the
    `with` lasts: what the tests compare glm53ctl's faster settings with."""
    from triton.runtime import interpreter as ti

    stock = getattr(ti, "_glm53ctl_stock", None)
    fast = (ti._patch_lang, ti.GridExecutor.__call__)
    if stock:
        ti._patch_lang, ti.GridExecutor.__call__ = stock
    before = set_checks(True, False)
    try:
        yield
    finally:
        set_checks(*before)
        if stock:
            ti._patch_lang, ti.GridExecutor.__call__ = fast


def configure() -> None:
    """glm53ctl's settings (kernels/tlx.py applies them where TRITON_INTERPRET=1): the patches once per process;
    the overflow check and asserts on exactly when TRITON_DEBUG=1."""
    import triton

    _patch_language_once_per_launch()
    debug = bool(triton.knobs.runtime.debug)  # TRITON_DEBUG
    set_checks(debug, debug)
