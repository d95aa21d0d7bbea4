#!/usr/bin/env bash
# On a GPU machine, after `glm53ctl build -m glm53_flash --kind model --tp 8 --rows 1 --context 4096` on a CPU
# (build/kernels carried): the step's bench without the carried cache, then with it, each from an empty Triton
# cache, every stderr line stamped with the seconds since the command started; then the step's outputs with the
# carried kernels and with kernels compiled there, compared bit for bit. Results under $OUT.
set -uo pipefail
stamp() { python3 -u -c "import sys,time;t=time.time();[print(f'{time.time()-t:7.2f} {l}',end='',flush=True) for l in sys.stdin]"; }
key="--kind model --tp 8 --rows 1 --context 4096"
TRITON_CACHE_DIR=/tmp/triton-plain glm53ctl bench $key --json > $OUT/plain.json 2> >(stamp > $OUT/plain.err)
TRITON_CACHE_DIR=/tmp/triton-carried glm53ctl bench $key --cache build/kernels --json > $OUT/carried.json 2> >(stamp > $OUT/carried.err)
sleep 1
# the same outputs from loaded and from compiled kernels (check --save: every output and write of the key's launch)
TRITON_CACHE_DIR=/tmp/triton-bits-a glm53ctl check $key --cache build/kernels --save /tmp/bits-carried > $OUT/bits.log 2>&1
TRITON_CACHE_DIR=/tmp/triton-bits-b glm53ctl check $key --save /tmp/bits-compiled >> $OUT/bits.log 2>&1
glm53ctl compare /tmp/bits-compiled/*.safetensors /tmp/bits-carried/*.safetensors > $OUT/compare.txt 2>&1; echo "compare rc=$?" >> $OUT/compare.txt
for f in plain carried; do echo "== $f"; tail -3 $OUT/$f.err; python3 -c "
import json; d=json.load(open('$OUT/$f.json')); r=d['keys'][0]; print(r['kind'], r['tp'], r['rows'], round(r['us'],1), 'us', r.get('kernels'))"; done
ls /tmp/bits-carried /tmp/bits-compiled; tail -5 $OUT/bits.log; tail -4 $OUT/compare.txt
