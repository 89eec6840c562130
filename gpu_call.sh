python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 || exit 1
mkdir -p $OUT
BARACUDA_HYPOTHESIS_PROFILE=simulator timeout 470 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_torch_modules.py tests/test_torch_e2e.py tests/test_dynamic.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
