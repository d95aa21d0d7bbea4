#!/usr/bin/env bash
# On a GPU machine, after `glm53ctl build -m glm53_flash --kind model --tp 8,4,... --rows 1,8,2,4 --context 4096`
# on a CPU (build/kernels carried):
# 1. the step's bench at TP8 rows 1 without the carried cache, then with it, each from an empty Triton cache, every
#    stderr line stamped with the seconds since the command started;
# 2. a layer's outputs with carried kernels and with kernels compiled there (check --save), compared bit for bit;
# 3. the step's matrix with the carried cache, one TP width a command (bench --save writes at its end).
# Results in $OUT/results.tgz (m/: the matrix's JSON and pictures): $OUT takes back few files.
set -uo pipefail
FINAL=$OUT; OUT=/tmp/res; mkdir -p $OUT
pack() { tar czf $FINAL/results.tgz -C $OUT .; }
stamp() { python3 -u -c "import sys,time;t=time.time();[print(f'{time.time()-t:7.2f} {l}',end='',flush=True) for l in sys.stdin]"; }
key="--kind model --tp 8 --rows 1 --context 4096"
TRITON_CACHE_DIR=/tmp/triton-plain glm53ctl bench $key --json > $OUT/plain.json 2> >(stamp > $OUT/plain.err)
TRITON_CACHE_DIR=/tmp/triton-carried glm53ctl bench $key --cache build/kernels --json > $OUT/carried.json 2> >(stamp > $OUT/carried.err)
sleep 1
layer="--kind kda --tp 8 --rows 1"
TRITON_CACHE_DIR=/tmp/triton-bits-a glm53ctl check $layer --cache build/kernels --save /tmp/bits-carried > $OUT/bits.log 2>&1
TRITON_CACHE_DIR=/tmp/triton-bits-b glm53ctl check $layer --save /tmp/bits-compiled >> $OUT/bits.log 2>&1
glm53ctl compare /tmp/bits-compiled/*.safetensors /tmp/bits-carried/*.safetensors > $OUT/compare.txt 2>&1; echo "compare rc=$?" >> $OUT/compare.txt
for f in plain carried; do echo "== $f"; grep -E "first timed|elapsed" $OUT/$f.err; python3 -c "
import json; d=json.load(open('$OUT/$f.json')); r=d['keys'][0]; print(d['environment']['gpu_name'], r['kind'], r['tp'], r['rows'], round(r['us'],1), 'us', r.get('kernels'))"; done
grep -E "kda|loaded|compiled" $OUT/bits.log | tail -6; tail -3 $OUT/compare.txt
pack
mkdir -p $OUT/m
for tp in ${MATRIX_TPS:-8 4}; do
  timeout ${MATRIX_S:-150} glm53ctl bench --kind model --tp $tp --rows 1,2,4,8 --context 4096 --rounds 7 --cache build/kernels --save $OUT/m > $OUT/m/tp$tp.txt 2> >(stamp > $OUT/m/tp$tp.err)
  echo "TP$tp rc=$?"; grep -E "first timed|elapsed" $OUT/m/tp$tp.err | tail -4
  pack
done
