python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 || exit 1
mkdir -p $OUT
cat > /tmp/knobs.py <<'PY'
import benchmarks.tune_linear as t
t.FUSED_VARIANT = False
t.STATIC_VARIANT = False
t.SMOOTHQUANT_EXTRA = {}
t.FUSED_EXTRA = {}
t.STATIC_ACT_EXTRA = {"two": {f"plans.{name}": 0 for name in ("FUSED_MAX_M", "FUSED_ANY_SHAPE_MAX_M", "STATIC_FUSED_MAX_M",
                                                               "ONE_WAVE_FUSED_MAX_M", "WIDE_FUSED_MAX_M",
                                                               "WIDE_ONE_WAVE_FUSED_MAX_M")}}
t.main()
PY
timeout 560 python3 /tmp/knobs.py --out $OUT/tune --only fused --decode-nk 4096x4096 11008x4096 --decode-m 1 4 > $OUT/tune.log 2>&1
tail -40 $OUT/tune.log | cut -c1-300
