#!/usr/bin/env bash
# On a GPU machine: what the layer's critical path is made of (docs/perf/path.md), in one call:
# 1. each traced launch's path at rows 1, 4K, over $KINDS at each of $TPS (bench --trace, and as a Perfetto trace);
# 2. the latency-bound steps' bodies alone (bench --op $OPS, each over its own sizes or $SIZES);
# 3. with STEP=1, the whole step (bench --kind model) at TP8 rows 1, 4K.
# CACHE=<a carried CPU build's kernel folder> loads the kernels it holds (build on a CPU, carry the folder).
# Results packed into $OUT/results.tgz after each step (a call cut short keeps what is done).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/path; rm -rf $OUT; mkdir -p $OUT
pack() { tar czf "$FINAL/results.tgz" -C "$OUT" .; }
[ -n "${PYTHONPATH:-}" ] || . benchmarks/gpu_setup.sh
cache=${CACHE:+--cache $CACHE}
kinds=${KINDS:-dense,kda,sparse,tail}; ctx=""; [[ $kinds == *sparse* ]] && ctx="--context 4096"  # the cache readers'
for tp in ${TPS:-8}; do
  timeout "${TRACE_S:-200}" glm53ctl bench -m glm53_flash --kind $kinds --tp $tp --rows 1 $ctx --trace --perfetto "$OUT/path-tp$tp.perfetto.json" --save "$OUT/trace-tp$tp" $cache \
    > "$OUT/trace-tp$tp.txt" 2> "$OUT/trace-tp$tp.err"
  echo "trace TP$tp: exit $?" | tee -a "$OUT/summary.txt"; pack
done
timeout "${OPS_S:-150}" glm53ctl bench -m glm53_flash --op ${OPS:-select,route,kda_head,gate,scores,mla_attention} \
  ${SIZES:+--sizes $SIZES} --save "$OUT/ops" > "$OUT/ops.txt" 2> "$OUT/ops.err"
echo "ops: exit $?" | tee -a "$OUT/summary.txt"; pack
if [ "${STEP:-0}" = 1 ]; then
  timeout "${STEP_S:-200}" glm53ctl bench -m glm53_flash --kind model --tp 8 --rows 1 --context 4096 --save "$OUT/step" \
    $cache > "$OUT/step.txt" 2> "$OUT/step.err"
  echo "step: exit $?" | tee -a "$OUT/summary.txt"; pack
fi
cat "$OUT/ops.txt"; for f in "$OUT"/trace-tp*.txt; do grep -E "launch:|->|% of copy" "$f" | head -70; done
[ -f "$OUT/step.txt" ] && tail -n 5 "$OUT/step.txt" "$OUT/step.err"
cat "$OUT/summary.txt"
