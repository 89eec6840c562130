python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
timeout 200 python3 benchmarks/tune_int4.py --sections dequantize --only dequantize > $OUT/tune-int4.log 2>&1; echo "tune_int4 rc $?"
grep -v "^|" $OUT/tune-int4.log | tail -34
timeout 330 python3 benchmarks/tune_elementwise.py --variants policy --only tensor group128 "token dequantize" > $OUT/tune-ew-policy.log 2>&1; echo "tune_ew rc $?"
sed -n '/^| case/,$p' $OUT/tune-ew-policy.log; grep -i "torch\|copy" $OUT/tune-ew-policy.log | head -3
