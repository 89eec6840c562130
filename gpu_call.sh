python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 || exit 1
timeout 300 python3 -m benchmarks.tune_linear --out $OUT/tune --only fused --decode-nk 4096x4096 --decode-m 1 2 2>&1 | tee $OUT/tune.out | grep -v "^{" | tail -5
