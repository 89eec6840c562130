python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 || exit 1
mkdir -p $OUT
BARACUDA_HYPOTHESIS_PROFILE=simulator timeout 120 compute-sanitizer --tool memcheck --print-limit 40 python3 -m pytest -q -p no:cacheprovider tests/test_linear.py -k "smoothquant_chain and True-True and (16-4096 or 4-8192)" > $OUT/memcheck.log 2>&1
tail -4 $OUT/memcheck.log; grep -c "cuGetProcAddress" $OUT/memcheck.log; grep -E "Invalid|ERROR SUMMARY" $OUT/memcheck.log | head -5
cat > /tmp/knobs.py <<'PY'
import benchmarks.tune_linear as t
t.FUSED_VARIANT = False
t.STATIC_VARIANT = False
t.SMOOTHQUANT_EXTRA = {}
t.STATIC_ACT_EXTRA = {"three": {"plans.STATIC_QUANTIZER": False}, "t64": {"plans.STATIC_QUANTIZER_THREADS": 64},
                      "t256": {"plans.STATIC_QUANTIZER_THREADS": 256}}
t.main()
PY
timeout 420 python3 /tmp/knobs.py --out $OUT/tune --only fused --decode-nk 11008x4096 8192x8192 --decode-m 16 > $OUT/tune.log 2>&1
tail -40 $OUT/tune.log | cut -c1-300
