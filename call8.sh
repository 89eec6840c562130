python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
mkdir -p $OUT
BARACUDA_HYPOTHESIS_PROFILE=simulator timeout 500 compute-sanitizer --tool memcheck --error-exitcode 99 \
  python3 -m pytest -q -x -p no:cacheprovider "tests/test_per_axis.py::test_last_axis_channel_vectors_and_their_alignment" \
  "tests/test_per_axis.py::test_last_axis_channels_thread_stationary_and_not" \
  tests/test_torch_gpu.py::test_channel_vector_kernels_with_parameter_views_off_their_vector_alignment \
  tests/test_torch_gpu.py::test_remembered_calls_launch_without_rechecking_and_fall_back_when_misaligned \
  > $OUT/sanitizer.log 2>&1
echo "compute-sanitizer exit: $?"; grep -E "ERROR SUMMARY|passed|failed" $OUT/sanitizer.log | tail -3; grep -c "Invalid\|misaligned\|Misaligned" $OUT/sanitizer.log
