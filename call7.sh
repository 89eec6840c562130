python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
mkdir -p $OUT
timeout 120 python3 benchmarks/tune_elementwise.py --variants unroll --only "channel[last]" 2>&1 | grep -v Warning | grep -v "^unroll" | tee $OUT/tune-vectors.txt
timeout -s INT 450 python3 -m pytest -q -p no:cacheprovider -n 15 2>&1 | tail -8 | tee $OUT/gpu-tests.txt
