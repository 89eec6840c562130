python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
git log --oneline | head -1
timeout -s INT 500 python3 -m pytest -q tests -n 15 -p no:cacheprovider > $OUT/pytest-full.log 2>&1; echo "pytest rc $?"
tail -15 $OUT/pytest-full.log
