#!/usr/bin/env bash
# On a GPU machine: `glm53ctl report --against REF` over several key sets, one report a set, each within its own
# time limit so that a set that runs out keeps the others (a report is written after each of its parts).
# Usage: benchmarks/gpu_report.sh REF SET...; SET is KINDS:TPS:ROWS:PARTS[:CONTEXT[:SECONDS]] (e.g. dense,kda:4,8:1,8:check,
# sparse,tail:8:1:build,bench:4096:300; SECONDS: its limit, default $SET_S or 280).
# Each set's report.md/json/html in <kinds>-tp<tps>-<parts>/; a summary line a set last. Carry .whl and REF's
# worktree (build/worktrees/<sha12>) so that nothing is fetched. $OUT gives back at most 8 files: everything is also
# packed into $OUT/reports.tgz (after each set), beside $OUT/summary.txt.
set -uo pipefail
ref=$1; shift
FINAL=$OUT; OUT=/tmp/reports; rm -rf $OUT; mkdir -p $OUT
[ -n "${PYTHONPATH:-}" ] || . benchmarks/gpu_setup.sh
for set in "$@"; do
  IFS=: read -r kinds tps rows parts context limit <<< "$set"
  name="${kinds//,/-}-tp${tps//,/-}-${parts//,/-}"
  start=$(date +%s)
  timeout "${limit:-${SET_S:-280}}" glm53ctl report --against "$ref" -m glm53_flash --kind "$kinds" --tp "$tps" --rows "$rows" \
    --parts "$parts" ${context:+--context $context} --html --out "$OUT/$name" > "$OUT/$name.out" 2> "$OUT/$name.err"
  echo "$name: exit $? in $(( $(date +%s) - start )) s: $(cat "$OUT/$name.out")" >> "$OUT/summary.txt"
  tar czf "$FINAL/reports.tgz" -C "$OUT" .  # after each set: a call cut short keeps the sets done
done
cp "$OUT/summary.txt" "$FINAL/"
cat "$OUT/summary.txt"
