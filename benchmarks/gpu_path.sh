#!/usr/bin/env bash
# On a GPU machine: what the layer's critical path is made of at TP8 rows 1, 4K (docs/perf/path.md): each traced
# launch's path (bench --trace, and as a Perfetto trace), and the latency-bound steps' bodies alone (bench --op).
# Results in $OUT: trace.txt (the paths), trace/ (its JSON), path.perfetto.json, ops.txt/ops.json.
set -uo pipefail
[ -n "${PYTHONPATH:-}" ] || . benchmarks/gpu_setup.sh
timeout "${TRACE_S:-200}" glm53ctl bench -m glm53_flash --kind ${KINDS:-dense,kda,sparse,tail} --tp ${TPS:-8} --rows 1 \
  --context 4096 --trace --perfetto "$OUT/path.perfetto.json" --save "$OUT/trace" > "$OUT/trace.txt" 2> "$OUT/trace.err"
echo "trace: exit $?"
timeout "${OPS_S:-100}" glm53ctl bench -m glm53_flash --op select,route --save "$OUT/ops" > "$OUT/ops.txt" 2> "$OUT/ops.err"
echo "ops: exit $?"
cat "$OUT/ops.txt"; grep -A40 "traced launch" "$OUT/trace.txt" | grep -E "launch:|critical|->" | head -80
