set +e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
G="glm53ctl bench --rounds 11 -j 16"
timeout 300 $G --kind dense,kda --tp 8,4,2,1 --rows 1,2,8 --baseline stages --save $OUT/m1 --markdown > $OUT/m1.md 2> $OUT/m1.err
tail -2 $OUT/m1.err
timeout 150 $G --kind sparse,tail --tp 8,4 --rows 1,8 --context 4096 --baseline stages --save $OUT/m2 --markdown > $OUT/m2.md 2> $OUT/m2.err
tail -2 $OUT/m2.err
timeout 60 $G --kind dense,kda --tp 8 --rows 1 --knobs launch=stages --trace --save $OUT/tr > $OUT/trace_stages.txt 2> $OUT/trace_stages.err
tail -2 $OUT/trace_stages.err
timeout 45 $G --kind dense --tp 8 --rows 1 --trace --save $OUT/trp > $OUT/trace_persistent.txt 2> $OUT/trace_p.err
cat $OUT/m1.md $OUT/m2.md
grep -B2 -A14 "^critical path" $OUT/trace_stages.txt | head -60
