"""The `embed` kind: token ids -> the 4-stream H (vocab-parallel gather, all-reduce). Its facts: knobs, bounds.

Files: `table.py` (its tasks), `kernel.py` (the persistent kernel), `launch.py` (buffers and arguments),
`harness.py` (one key with its peers, as `check`, `fault`, `run` and `build` use it).
"""

from glm53ctl.kernels.kinds.base import LAUNCH, Knob

KNOBS = (LAUNCH, Knob("chunk", (256, 512, 1024), 1024, "schedule", "hidden-dim columns per embed task"))
RUNTIME = ("grid", "warps", "handoff", "poll")
RUNTIME_DEFAULTS = {}
# a gather and a sum with one non-zero rank: exact
BOUNDS = {"H": 0.0}
