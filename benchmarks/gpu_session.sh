#!/usr/bin/env bash
# One GPU-machine session: environment, the test suite, the benchmark, the demo. Logs go to $OUT.
# Usage (device tool, carrying .whl): bash benchmarks/gpu_session.sh [pytest args...]
# BARACUDA_TEST_SHARD=i/n (tests/conftest.py) runs every n-th test from the i-th: tests/test_linear.py alone takes
# about 11 minutes with 16 workers, past one device call; two or four shards each print their summary.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import numpy, numba, numba_cuda, torch; print('numpy', numpy.__version__, 'numba', numba.__version__, 'torch', torch.__version__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-480} python3 -m pytest -q ${PYTEST_X:--x} -p no:cacheprovider -n ${WORKERS:-8} "$@" 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if [ "${SANITIZE:-0}" = 1 ]; then
  # memcheck over kernels of every family (about 500 s: run it in a device call of its own): sizes around chunk boundaries, unaligned views, group sizes,
  # the dynamic strategies, both GEMM kernels on ragged shapes, the remembered (trusted) launches. Reports go to $OUT/sanitizer.log.
  BARACUDA_HYPOTHESIS_PROFILE=simulator timeout 560 compute-sanitizer --tool memcheck --error-exitcode 99 \
    python3 -m pytest -q -x -p no:cacheprovider tests/test_per_tensor.py::test_sizes_around_pack_and_block_boundaries \
    tests/test_per_tensor.py::test_unaligned_views_use_the_element_path tests/test_per_axis.py::test_llm_group_sizes \
    "tests/test_dynamic.py::test_identity_with_the_static_plans" tests/test_linear.py::test_gpu_against_torch_int_mm \
    tests/test_dynamic.py::test_gpu_many_rows_deterministic_and_torch_composition tests/test_int4.py::test_gpu_packed_ops_match_reference \
    tests/test_linear.py::test_gpu_plans_sharing_a_kernel_with_different_shared_memory \
    tests/test_torch_gpu.py::test_remembered_calls_launch_without_rechecking_and_fall_back_when_misaligned \
    tests/test_torch_gpu.py::test_channel_vector_kernels_with_parameter_views_off_their_vector_alignment \
    tests/test_linear.py::test_gpu_op_fast_path_repeats_and_falls_back \
    tests/test_linear.py::test_gpu_fused_decode_equals_two_launches_and_torch \
    > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer exit: $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | tail -3
fi
if [ "${DEMO:-0}" = 1 ]; then  # the README's main job, on the GPU
  timeout 180 python3 -m baracuda_numba demo 2>&1 | tee "$OUT/demo.log" | tail -40
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout ${BENCH_TIMEOUT:-480} python3 -m benchmarks ${BENCH_ARGS:-} --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -80
fi
