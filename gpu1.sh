set +e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
G="glm53ctl bench --rounds 15 -j 16"
$G --kind dense,kda,tail --tp 8,4 --rows 1 --baseline stages --save $OUT/b1 --markdown > $OUT/b1.md 2> $OUT/b1.err
tail -3 $OUT/b1.err
$G --kind sparse --tp 8,4 --rows 1 --context 4096 --baseline stages --save $OUT/b2 --markdown > $OUT/b2.md 2> $OUT/b2.err
tail -3 $OUT/b2.err
$G --kind dense,kda --tp 8 --rows 1 --knobs launch=stages --trace > $OUT/trace.txt 2> $OUT/trace.err
tail -3 $OUT/trace.err
cat $OUT/b1.md $OUT/b2.md
