python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
timeout 400 python3 benchmarks/tune_elementwise.py --variants prefetch --only "channel[0] quantize" "token quantize" "group128 quantize" "group128 dequantize" "token dequantize" > $OUT/tune-ew-prefetch.log 2>&1; echo "tune_ew rc $?"
sed -n '/^| case/,$p' $OUT/tune-ew-prefetch.log; grep -c "of copy" $OUT/tune-ew-prefetch.log; tail -3 $OUT/tune-ew-prefetch.log
