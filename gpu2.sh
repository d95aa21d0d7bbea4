set +e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
G="glm53ctl bench --rounds 15 -j 16"
$G --kind dense,kda --tp 8,4,2,1 --rows 1,2,8 --baseline stages --save $OUT/m1 --markdown > $OUT/m1.md 2> $OUT/m1.err
tail -2 $OUT/m1.err
$G --kind dense,kda --tp 8 --rows 1 --knobs launch=stages --trace > $OUT/trace_stages.txt 2> $OUT/trace_stages.err
$G --kind dense,kda --tp 8 --rows 1 --trace > $OUT/trace_persistent.txt 2> $OUT/trace_p.err
tail -2 $OUT/trace_stages.err $OUT/trace_p.err
cat $OUT/m1.md
grep -A12 "critical path" $OUT/trace_stages.txt | head -40
