#!/usr/bin/env bash
# On a GPU machine: one change of the layer's path (issue 47) decided and shown in one call. Each step has its own
# time limit, and everything is packed into $OUT/results.tgz after each step (a call cut short keeps what is done):
# 1. `glm53ctl tune --space SPACE --trials N --write` over each SET (KINDS:TPS:ROWS:SPACE[:N[:SECONDS]]): a knob
#    kept only where it measures faster at that width (A B B A against the tuned default); tune's JSON, the files;
# 2. `glm53ctl bench --trace --perfetto` of $TRACE_KINDS at TP8 rows 1, 4K, under the tuned files: the new path;
# 3. with REF: `glm53ctl report --against $REF --parts $PARTS --html` over $REPORT_KINDS, TP8, rows 1 and 8, 4K.
# Usage: REF=build/worktrees/<sha> benchmarks/gpu_path_change.sh kda:8,4:1:route sparse:8:1:route,select:4
# Carry .whl and REF's worktree. Limits: TUNE_S a set (200), TRACE_S (150), REPORT_S (240).
set -uo pipefail
FINAL=$OUT; OUT=/tmp/path-change; rm -rf $OUT; mkdir -p $OUT
pack() { tar czf "$FINAL/results.tgz" -C "$OUT" .; }
[ -n "${PYTHONPATH:-}" ] || . benchmarks/gpu_setup.sh
for set in "$@"; do
  IFS=: read -r kinds tps rows space trials limit <<< "$set"
  name="tune-${kinds//,/-}-tp${tps//,/-}-r${rows//,/-}-${space//,/-}"
  ctx=""; [[ $kinds == *sparse* ]] && ctx="--context 4096"  # a context for the kinds that read caches only
  timeout "${limit:-${TUNE_S:-200}}" glm53ctl tune -m glm53_flash --kind "$kinds" --tp "$tps" --rows "$rows" $ctx \
    --space "$space" --trials "${trials:-2}" --top 1 --write --json > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name: exit $?" | tee -a "$OUT/summary.txt"
  cp configs/tuned/glm53_flash/tp*.json "$OUT/"; git diff -- CHANGELOG.md > "$OUT/changelog.diff" 2>/dev/null
  pack
done
timeout "${TRACE_S:-150}" glm53ctl bench -m glm53_flash --kind "${TRACE_KINDS:-kda,sparse}" --tp 8 --rows 1 --context 4096 \
  --trace --perfetto "$OUT/path.perfetto.json" --save "$OUT/trace" > "$OUT/trace.txt" 2> "$OUT/trace.err"
echo "trace: exit $?" | tee -a "$OUT/summary.txt"
pack
if [ -n "${REF:-}" ]; then
  timeout "${REPORT_S:-240}" glm53ctl report --against "$REF" -m glm53_flash --kind "${REPORT_KINDS:-dense,kda,sparse,tail}" \
    --tp 8 --rows 1,8 --context 4096 --parts "${PARTS:-check,build,bench}" --html --out "$OUT/report" \
    > "$OUT/report.out" 2> "$OUT/report.err"
  echo "report: exit $? $(cat "$OUT/report.out")" | tee -a "$OUT/summary.txt"
  pack
fi
for f in "$OUT"/tune-*.err; do tail -12 "$f"; done
grep -E "launch:|->" "$OUT/trace.txt" | head -60
cat "$OUT/summary.txt"
