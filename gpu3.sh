set +e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
G="glm53ctl bench --rounds 15 -j 16"
$G --kind sparse --tp 8,4,2,1 --rows 1,2,8 --context 4096 --baseline stages --save $OUT/m2 --markdown > $OUT/m2.md 2> $OUT/m2.err
tail -2 $OUT/m2.err
$G --kind tail --tp 8,4,2,1 --rows 1,2,8 --baseline stages --save $OUT/m3 --markdown > $OUT/m3.md 2> $OUT/m3.err
tail -2 $OUT/m3.err
$G --kind sparse --tp 8 --rows 1 --context 4096 --knobs launch=stages --trace > $OUT/trace_sparse.txt 2> $OUT/trace_sparse.err
tail -2 $OUT/trace_sparse.err
cat $OUT/m2.md $OUT/m3.md
