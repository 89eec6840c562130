"""The integer-pipe device primitives against NumPy: the same kernels on the simulator (their Python
models) and on a GPU (the instructions). Inputs hold every boundary the kernels rely on: ties,
NaN, +-inf, values past the int32 range, 16-bit lanes on both sides of 0x8000."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from baracuda_numba.kernels import device, memory

TIES = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 126.5, -127.5, 1e10, -1e10, 2.0**31,
        -(2.0**31), np.inf, -np.inf, np.nan, -0.0, 0.0, 3.0, -3.0]


def _round_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = device.round_to_int(x[i])


def _expected_round(x: np.ndarray) -> np.ndarray:
    r = np.rint(np.where(np.isnan(x), 0.0, x).astype(np.float64))  # float64: 2**31 - 1 is exact there
    return np.clip(r, -(2.0**31), 2.0**31 - 1).astype(np.int32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_to_int_is_rint_with_nan_zero_and_saturation(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([np.array(TIES), rng.normal(0, 300, 43)]).astype(dtype)
    out = np.zeros(x.size, np.int32)
    cuda.jit(_round_kernel)[1, 64](x, out)
    np.testing.assert_array_equal(out, _expected_round(x))


def _lanes_kernel(a, b, lo, hi, q, maxes, clamps, packs):
    i = cuda.grid(1)
    if i < a.size:
        maxes[i] = device.max_s16x2(a[i], b[i])
        clamps[i] = device.clamp_s32(q[i], lo[i], hi[i])
        packs[i] = device.pack_bytes4(q[i], lo[i], hi[i], q[i] + 1)


def test_integer_lanes_clamp_and_byte_packing():
    rng = np.random.default_rng(1)
    n = 64
    a = rng.integers(0, 2**32, n, dtype=np.uint64)
    b = rng.integers(0, 2**32, n, dtype=np.uint64)
    a[:4] = [0x7FFF8000, 0x00807F80, 0x80007FFF, 0xFFFF0001]  # the int16 sign boundary in both lanes
    b[:4] = [0x80007FFF, 0x7F800080, 0x7FFF8000, 0x0001FFFF]
    q = rng.integers(-600, 600, n).astype(np.int32)
    lo = rng.integers(-300, 0, n).astype(np.int32)
    hi = rng.integers(0, 300, n).astype(np.int32)
    maxes, clamps, packs = np.zeros(n, np.uint64), np.zeros(n, np.int32), np.zeros(n, np.uint64)
    cuda.jit(_lanes_kernel)[1, 64](a, b, lo, hi, q, maxes, clamps, packs)

    def lanes(w):
        return [((w >> s) & 0xFFFF).astype(np.uint16).view(np.int16).astype(np.int64) for s in (0, 16)]

    expected_max = sum(((np.maximum(x, y) & 0xFFFF) << s) for (x, y), s in
                       zip(zip(lanes(a), lanes(b), strict=True), (0, 16), strict=True))
    np.testing.assert_array_equal(maxes, expected_max.astype(np.uint64))
    np.testing.assert_array_equal(clamps, np.minimum(np.maximum(q, lo), hi))
    as_bytes = [v.astype(np.int64) & 0xFF for v in (q, lo, hi, q + 1)]
    np.testing.assert_array_equal(packs, sum(v << (8 * k) for k, v in enumerate(as_bytes)).astype(np.uint64))


def _nibble_pairs_kernel(hi, lo, rest, signed, unsigned, words):
    i = cuda.grid(1)
    if i < hi.size:
        signed[i] = device.pack_s4_pair(hi[i], lo[i], rest[i])
        unsigned[i] = device.pack_u4_pair(hi[i], lo[i], rest[i])
        word = np.uint64(0)  # the chain the packed kernels use: eight nibbles, element 0 lowest
        for k in range(3, -1, -1):
            word = device.pack_s4_pair(lo[i] + 2 * k + 1, lo[i] + 2 * k, word)
        words[i] = word


def test_nibble_pairs_saturate_and_chain_into_words():
    rng = np.random.default_rng(4)
    n = 64
    hi = rng.integers(-20, 20, n).astype(np.int32)
    lo = rng.integers(-20, 20, n).astype(np.int32)
    hi[:6], lo[:6] = [-8, 7, 15, 16, -9, 0], [7, -8, 0, -1, 8, 15]  # both ends of both ranges, and past them
    rest = rng.integers(0, 2**32, n, dtype=np.uint64)
    signed, unsigned, words = (np.zeros(n, np.uint64) for _ in range(3))
    cuda.jit(_nibble_pairs_kernel)[1, 64](hi, lo, rest, signed, unsigned, words)

    def pair(low, high):
        h, lw = (np.clip(v.astype(np.int64), low, high) & 0xF for v in (hi, lo))
        return (((rest.astype(np.int64) << 8) | (h << 4) | lw) & 0xFFFFFFFF).astype(np.uint64)

    np.testing.assert_array_equal(signed, pair(-8, 7))
    np.testing.assert_array_equal(unsigned, pair(0, 15))
    nibbles = [np.clip(lo.astype(np.int64) + j, -8, 7) & 0xF for j in range(8)]
    np.testing.assert_array_equal(words, sum(v << (4 * j) for j, v in enumerate(nibbles)).astype(np.uint64))


def _clamp_nan_kernel(x, lo, hi, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = device.clamp_nan_f32(x[i], lo[0], hi[0])


def test_clamp_nan_keeps_nan_and_clamps_infinities():
    x = np.array([*TIES, 448.0, 449.0, -448.5, 1e-30], np.float32)
    lo, hi = np.array([-448.0], np.float32), np.array([448.0], np.float32)
    out = np.zeros_like(x)
    cuda.jit(_clamp_nan_kernel)[1, 64](x, lo, hi, out)
    expected = np.where(np.isnan(x), np.nan, np.clip(x, lo[0], hi[0])).astype(np.float32)
    np.testing.assert_array_equal(out, expected)


def _half_pairs_kernel(a, b, out):
    i = cuda.grid(1)
    if i < a.size:
        out[0, i] = device.max_bf16x2(a[i], b[i])
        out[1, i] = device.min_bf16x2(a[i], b[i])
        out[2, i] = device.max_f16x2(a[i], b[i])
        out[3, i] = device.min_f16x2(a[i], b[i])


def test_half_pair_min_max_match_numpy_values():
    """Lane-wise float min / max of bf16 and f16 pairs (no NaN: the callers replace non-finite lanes
    first); values compared, so a +-0 tie may keep either zero."""
    rng = np.random.default_rng(2)
    n = 64
    bits = rng.integers(0, 2**16, (2, 2, n), dtype=np.uint64)
    # +-0, +-inf of f16 (finite in bf16, whose callers never pass inf), the smallest subnormals
    bits[..., :6] = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x8001], np.uint64)
    for which in range(2):  # no NaN in either format
        nan_bf16 = (bits[which] & 0x7FFF) > 0x7F80
        nan_f16 = (bits[which] & 0x7FFF) > 0x7C00
        bits[which][nan_bf16 | nan_f16] &= 0x8000
    a = bits[0, 0] | (bits[0, 1] << 16)
    b = bits[1, 0] | (bits[1, 1] << 16)
    out = np.zeros((4, n), np.uint64)
    cuda.jit(_half_pairs_kernel)[1, 64](a, b, out)

    def values(words, lane, to_float):
        return to_float(((words >> (16 * lane)) & 0xFFFF).astype(np.uint16))

    def bf16(h):
        return (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    def f16(h):
        return h.view(np.float16).astype(np.float64)

    for row, (pick, to_float) in enumerate([(np.maximum, bf16), (np.minimum, bf16), (np.maximum, f16),
                                            (np.minimum, f16)]):
        for lane in (0, 1):
            np.testing.assert_array_equal(values(out[row], lane, to_float),
                                          pick(values(a, lane, to_float), values(b, lane, to_float)))


def _pair_encode_kernel(x, bf16_out, f16_out):
    i = cuda.grid(1)
    if 2 * i + 1 < x.size:
        bf16_out[i] = device.f32x2_to_bf16x2_bits(x[2 * i], x[2 * i + 1])
        f16_out[i] = device.f32x2_to_f16x2_bits(x[2 * i], x[2 * i + 1])


def _halves(words: np.ndarray) -> np.ndarray:
    """The 16-bit lanes of 32-bit words, low lane first (the order of the encoded elements)."""
    return np.stack([words & 0xFFFF, (words >> 16) & 0xFFFF], axis=1).reshape(-1).astype(np.uint16)


def test_pair_encoders_round_to_nearest_even_like_ml_dtypes():
    """Two float32 values per conversion, bit for bit with ml_dtypes / NumPy's round to nearest even
    (ties at both formats' half ulp, subnormals of both, overflow to inf); NaN stays NaN."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 2048, dtype=np.uint64).astype(np.uint32)
    ties = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 65520.0, 65519.99,
                     3.3895314e38, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-133, 2.0**-134, 1e-45],
                    np.float32)
    x = np.concatenate([bits.view(np.float32), ties, -ties, np.array(TIES, np.float32)])
    x = x[: x.size // 2 * 2]
    bf16_words = np.zeros(x.size // 2, np.uint64)
    f16_words = np.zeros(x.size // 2, np.uint64)
    cuda.jit(_pair_encode_kernel)[(x.size // 2 + 127) // 128, 128](x, bf16_words, f16_words)
    for words, dtype in ((bf16_words, ml_dtypes.bfloat16), (f16_words, np.float16)):
        got = _halves(words)
        with np.errstate(over="ignore"):
            want = x.astype(dtype).view(np.uint16)
        nan = np.isnan(x)
        np.testing.assert_array_equal(got[~nan], want[~nan])
        assert np.isnan(got[nan].view(dtype).astype(np.float32)).all()


def test_streaming_store_takes_the_chunk_widths_of_narrow_outputs():
    """The evict-first store (the tensor-scope quantize pass's) exists for 8-, 4- and 2-byte chunks, and
    says so for any other width rather than storing the wrong bits; the GPU tests of the tensor scope
    check its output against torch at each width (bf16 / f32 / f64 in, int8 out)."""

    for width in (8, 4, 2):
        assert callable(memory.streaming_store(width))
    for width in (16, 1, 3):
        with pytest.raises(ValueError, match="8, 4 or 2 bytes"):
            memory.streaming_store(width)
