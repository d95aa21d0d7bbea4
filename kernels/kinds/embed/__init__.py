"""The `embed` kind: token ids -> the 4-stream H (vocab-parallel gather, all-reduce). Its facts: knobs, bounds.

Files: `table.py` (its tasks), `kernel.py` (the persistent kernel), `launch.py` (buffers and arguments),
`harness.py` (one key with its peers, as `check`, `fault`, `run` and `build` use it).
"""

from glm53ctl.kernels.kinds.base import LAUNCH, Knob
from glm53ctl.kernels.kinds.dims import Dim, power_of_two_below

KNOBS = (LAUNCH, Knob("chunk", (256, 512, 1024), 1024, "schedule", "hidden-dim columns per embed task"))
RUNTIME = ("grid", "warps", "handoff", "poll")
RUNTIME_DEFAULTS = {}
# a gather and a sum with one non-zero rank: exact
BOUNDS = {"H": 0.0}
# a task's columns are min(chunk, hidden): a tl.arange below the chunk, masked from it up
DIMS = (Dim("model.hidden_size", power_of_two_below(1024), "an embed task's tl.arange over the columns"),)
