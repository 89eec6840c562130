python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT
timeout -s INT 540 python3 -m pytest -q -p no:cacheprovider -n 15 2>&1 | tail -25 | tee $OUT/gpu-tests.txt
