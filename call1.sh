python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
nvidia-smi -L
timeout -s INT 150 python3 -m pytest -q -x tests/test_int4.py -n 8 -p no:cacheprovider > $OUT/pytest-int4.log 2>&1; echo "pytest rc $?"
tail -3 $OUT/pytest-int4.log
timeout 170 python3 benchmarks/tune_int4.py --sections dequantize --only dequantize > $OUT/tune-int4.log 2>&1; echo "tune_int4 rc $?"
grep -v "^|" $OUT/tune-int4.log | tail -40
timeout 250 python3 benchmarks/tune_elementwise.py --variants policy > $OUT/tune-ew-policy.log 2>&1; echo "tune_ew rc $?"
sed -n '/^| case/,$p' $OUT/tune-ew-policy.log; grep -i "torch\|copy" $OUT/tune-ew-policy.log | head -3
