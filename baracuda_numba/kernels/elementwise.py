"""The elementwise quantize family: one kernel definition for every quantize / dequantize /
fake-quantize / backward op, every dtype pair and every scale granularity.

Math (the README's "Semantics" section), with ``inv = 1 / scale`` in the math precision (0 where ``scale == 0``) and
``t = rint(x * inv) + zero_point`` (round half to even):

- ``quantize``:              ``q = clamp(t, q_min, q_max)``, NaN -> ``clamp(zero_point)``
- ``dequantize``:            ``x = (q - zero_point) * scale``
- ``fake_quantize``:         ``y = (clamp(t, q_min, q_max) - zero_point) * scale`` (NaN propagates)
- ``quantize_backward``:     ``dx = dy * inv * mask``
- ``fake_quantize_backward``: ``dx = dy * mask``
- ``dequantize_backward``:   ``dq = dy * scale``

with ``mask = q_min <= t <= q_max`` (false for NaN, and false where ``scale == 0``).

FP8 outputs (E4M3fn, E5M2) are the same ops with the FP8 grid specialised in (``grid``, see
:func:`op_functions`): ``t = x * inv`` clamped to ``[q_min, q_max]`` (``+-fp8_max``) and rounded to
nearest even by the output encoder, NaN kept, no zero point.

Layout: operands are flat and C-contiguous, read and written in chunks of ``G`` consecutive
elements, ``G = 16 / (widest itemsize)``: the widest operand moves 16 bytes per chunk (one
``v2.u64`` access), the others ``G * itemsize`` bytes. Consecutive threads take consecutive chunks
(grid-stride, a tuning value's chunks in flight per thread: :class:`ElementwiseKernelTuning`), so every
access of a warp is coalesced, loads and stores alike. The ``n % G`` tail, or everything when an
operand is not aligned to its chunk, goes through the element path. Scales are a scalar (per tensor)
or arrays indexed by a segment: ``i // seg_len`` (per token / per group) or ``(i // seg_len) %
channels`` (per channel); when ``seg_len / G`` is a power of two the segment of chunk ``c`` is a shift
of ``c`` (``pow2_segments``), otherwise each thread tracks it without dividing. Chunks that span
channels (channels along the last axes) run a thread-stationary kernel where one grid stride is a whole
number of channel periods (each thread loads its G channels' parameters once), or, along the last axis
with a channel count that G divides, read each chunk's G scales and zero points as one vector
(``channel_vectors``). Integer outputs of the scalar, shift, thread-stationary and channel-vector
kernels are packed four bytes per word (``pack_bytes4``).
"""

from __future__ import annotations

import enum
import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import cuda

from ..platform import SIMULATOR
from ..vocabulary import ElementKind, MathPrecision
from . import device, memory
from .codecs import codec, math_type
from .device import device_function

__all__ = ["CHUNK_BYTES", "ElementwiseKernelTuning", "chunk_elements", "chunk_io", "chunk_view_itemsize",
           "op_functions", "uint_name", "ElementwiseOp", "ScaleMode", "ElementwiseKernel", "elementwise_kernel"]

CHUNK_BYTES = 16  # bytes per chunk of the widest operand
_UNTAGGED_UNROLL = 2  # kernel names tag the chunks in flight of the general kernels when they differ from this


@dataclass(frozen=True)
class ElementwiseKernelTuning:
    """What the elementwise kernels keep in flight and the launch bounds they are compiled with, for one card
    (part of each kernel's key). The values, and the measurement behind each, are the plans' tuning values
    (``baracuda_numba/plans/tuning.py``, :class:`~baracuda_numba.plans.tuning.ElementwiseTuning`)."""

    unroll: int  # chunks a thread of the general kernels loads before computing (a launch policy's own first)
    # input bytes in flight per thread of the general, shift and channel-vector kernels whose input is narrower
    # than their output (dequantize): their chunks in flight raised to cover this many (0: as they are)
    narrow_input_bytes: int
    general_launch_bounds: tuple[int, int] | None  # launch_bounds of the general kernels (None: none)
    pow2_unroll: int  # chunks in flight of the shift kernels (segments a power-of-two number of chunks)
    pow2_tiled_unroll: int  # chunks of one segment a thread of the tiled shift kernels (1: none)
    pow2_prefetch: int  # grid strides ahead at which the shift kernels ask L2 for their 16-byte inputs (0: none)
    pow2_launch_bounds: tuple[int, int] | None  # launch_bounds of the shift kernels with float32 math
    channel_launch_bounds: tuple[int, int] | None  # launch_bounds of the channel kernels whose chunks span channels
    stationary_input_bytes: int  # input bytes in flight per thread of the thread-stationary channel kernel
    stationary_launch_bounds: tuple[int, int]  # its launch_bounds (its grid: one wave of this many blocks per SM)


def chunk_elements(*elements: ElementKind | None) -> int:
    """Elements per chunk for a kernel over these operands."""
    return CHUNK_BYTES // max(e.itemsize for e in elements if e is not None)


class ElementwiseOp(enum.Enum):
    """What an elementwise kernel computes; the value is its arity (number of array inputs)."""

    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"
    FAKE_QUANTIZE = "fake_quantize"
    QUANTIZE_BACKWARD = "quantize_backward"
    FAKE_QUANTIZE_BACKWARD = "fake_quantize_backward"
    # PyTorch's float64 fake quantize: grid point in float64, product with the scale in float32
    FAKE_QUANTIZE_F32_PRODUCT = "fake_quantize_f32_product"
    DEQUANTIZE_BACKWARD = "dequantize_backward"

    @property
    def reads_saved_input(self) -> bool:
        """Backward ops that recompute the mask read the forward input next to ``d_output``."""
        return self in (ElementwiseOp.QUANTIZE_BACKWARD, ElementwiseOp.FAKE_QUANTIZE_BACKWARD)


class ScaleMode(enum.Enum):
    SCALAR = "scalar"
    ROWS = "rows"  # segment = i // seg_len
    CHANNELS = "channels"  # segment = (i // seg_len) % channels


@device_function
def quantize_int(x, inv, zp, q_min, q_max):
    """The integer quantize computed on the integer side: ``rint(x * inv)`` by one conversion (NaN
    gives 0, +-inf saturate), clamped to ``[q_min - zp, q_max - zp]`` in int32, plus ``zp`` (all
    integral floats): the integer of the op functions' ``clamp(rint(x * inv) + zp, q_min, q_max)``
    (NaN -> zp) for every input, since ``rint`` is monotone and fixes the integral bounds. About half
    the integer-pipe instructions of the float clamps and selects, which is what bounded the
    quantize kernels on an H100 (ncu, 2026-11-23). An int32."""
    zi = device.round_to_int(zp)
    return device.clamp_s32(device.round_to_int(x * inv), device.round_to_int(q_min) - zi,
                            device.round_to_int(q_max) - zi) + zi


@functools.cache
def op_functions(precision: MathPrecision, grid: ElementKind | None = None) -> dict[ElementwiseOp, Any]:
    """The per-element math of every op, as device functions in one math precision.

    ``grid`` is the quantized element when it is an FP8 format (None: an integer grid). The ops
    are the same definitions with the grid's rounding specialised in:

    - integer: ``t = rint(x * inv) + zp``, clamped to ``[q_min, q_max]``; NaN quantizes to ``zp``;
    - FP8: ``t = x * inv`` clamped to ``[q_min, q_max]`` (the format's finite range by default),
      rounded to the FP8 grid (nearest even) by the output encoder; no zero point (``zp = 0``);
      NaN stays NaN; a zero scale quantizes to 0. The straight-through mask is
      ``q_min <= x * inv <= q_max`` (inclusive, false for NaN): where the clamp is the identity,
      i.e. PyTorch's autograd of ``(x * inv).clamp(q_min, q_max)``.
    """
    M = math_type(precision)
    one, zero = M(1.0), M(0.0)
    rint = device.rint
    fp8 = grid is not None
    if fp8:
        grid_codec = codec(grid, precision)
        grid_encode, grid_decode = grid_codec.encode, grid_codec.decode
    else:
        @device_function
        def same(v):
            return v

        grid_encode = grid_decode = same

    @device_function
    def scaled(x, inv, zp):
        """The value on the quantized axis before the clamp (FP8 rounds after it, exactly so)."""
        if fp8:
            return x * inv
        return rint(x * inv) + zp

    @device_function
    def quantize(x, _unused, inv, scale, zp, q_min, q_max):
        t = scaled(x, inv, zp)
        if fp8:
            if inv == zero:
                t = zero
        elif t != t:
            t = zp
        if t < q_min:
            t = q_min
        if t > q_max:
            t = q_max
        return t

    @device_function
    def dequantize(q, _unused, inv, scale, zp, q_min, q_max):
        return (q - zp) * scale

    @device_function
    def grid_point(x, inv, zp, q_min, q_max):
        """The clamped value on the quantized grid: ``clamp(rint(x * inv) + zp, q_min, q_max)``, or
        for FP8 ``x * inv`` clamped and rounded to the format; NaN stays NaN."""
        t = scaled(x, inv, zp)
        if t < q_min:
            t = q_min
        if t > q_max:
            t = q_max
        if fp8:
            t = grid_decode(grid_encode(t))
        return t

    @device_function
    def fake_quantize(x, _unused, inv, scale, zp, q_min, q_max):
        return (grid_point(x, inv, zp, q_min, q_max) - zp) * scale

    f32 = np.float32

    @device_function
    def fake_quantize_f32_product(x, _unused, inv, scale, zp, q_min, q_max):
        # torch computes (q - zp) * scale with a float scale, whatever the data's dtype
        return M(f32(grid_point(x, inv, zp, q_min, q_max) - zp) * f32(scale))

    @device_function
    def mask(x, inv, zp, q_min, q_max):
        t = scaled(x, inv, zp)
        return one if (q_min <= t and t <= q_max and inv != zero) else zero

    @device_function
    def quantize_backward(dy, x, inv, scale, zp, q_min, q_max):
        return dy * inv * mask(x, inv, zp, q_min, q_max)

    @device_function
    def fake_quantize_backward(dy, x, inv, scale, zp, q_min, q_max):
        return dy * mask(x, inv, zp, q_min, q_max)

    @device_function
    def dequantize_backward(dy, _unused, inv, scale, zp, q_min, q_max):
        return dy * scale

    return {
        ElementwiseOp.QUANTIZE: quantize,
        ElementwiseOp.DEQUANTIZE: dequantize,
        ElementwiseOp.FAKE_QUANTIZE: fake_quantize,
        ElementwiseOp.QUANTIZE_BACKWARD: quantize_backward,
        ElementwiseOp.FAKE_QUANTIZE_BACKWARD: fake_quantize_backward,
        ElementwiseOp.FAKE_QUANTIZE_F32_PRODUCT: fake_quantize_f32_product,
        ElementwiseOp.DEQUANTIZE_BACKWARD: dequantize_backward,
    }


@dataclass(frozen=True)
class ElementwiseKernel:
    """An elementwise kernel specialised for one key, and what a launcher must know about it.

    Argument order: ``a_words, a_elems, b_words, b_elems, out_words, out_elems, scales, zero_points,
    n, nchunks, seg_len, channels, step_q, step_r, inv, scale, zero_point, q_min, q_max``, where
    ``(step_q, step_r) = divmod(gridsize * G, seg_len)`` (``step_q`` modulo ``channels`` in channel
    mode). A ``*_words`` array
    is the operand viewed as chunks (uint64 pairs for 16-byte chunks), ``*_elems`` as unsigned elements.
    """

    py_func: Any
    signature: str
    a: ElementKind
    b: ElementKind | None
    out: ElementKind
    precision: MathPrecision
    chunk: int  # elements per chunk (G)
    options: tuple = ()  # extra ``cuda.jit`` options as (name, value) pairs, e.g. launch_bounds
    unroll: int = 1  # chunks a thread has in flight (the grid is sized for it)
    resident_blocks: int = 0  # blocks per SM of a one-wave grid (thread-stationary kernels; 0: none)
    _compiled: dict = field(default_factory=dict, compare=False, repr=False)

    def compiled(self) -> Any:
        """The ``numba.cuda`` dispatcher, compiled for ``signature`` on first use."""
        dispatcher = self._compiled.get("dispatcher")
        if dispatcher is None:
            with _COMPILE_LOCK:
                dispatcher = self._compiled.get("dispatcher")
                if dispatcher is None:
                    options = {} if SIMULATOR else dict(self.options)  # the simulator's jit takes none
                    dispatcher = cuda.jit(self.signature, **options)(self.py_func)
                    self._compiled["dispatcher"] = dispatcher
        return dispatcher


_COMPILE_LOCK = threading.RLock()


def uint_name(itemsize: int) -> str:
    """The numba name of the unsigned integer of ``itemsize`` bytes."""
    return f"uint{8 * itemsize}"


def chunk_view_itemsize(chunk_bytes: int) -> int:
    """Itemsize of the array a chunk of ``chunk_bytes`` is read through (16 bytes: two uint64)."""
    return min(chunk_bytes, 8)


@functools.cache
def chunk_io(chunk_bytes: int):
    """``load(view, c) -> (lo, hi)`` and ``store(view, c, lo, hi)`` for one chunk width."""
    if chunk_bytes == 16:
        return device.load_u64x2, device.store_u64x2
    word_zero, u64 = np.uint64(0), np.uint64

    @device_function
    def load(view, c):
        return u64(view[c]), word_zero

    @device_function
    def store(view, c, lo, hi):
        view[c] = lo

    return load, store


def elementwise_kernel(
    op: ElementwiseOp,
    a: ElementKind,
    b: ElementKind | None,
    out: ElementKind,
    precision: MathPrecision,
    mode: ScaleMode = ScaleMode.SCALAR,
    uniform_chunk: bool = True,
    grid: ElementKind | None = None,
    pow2_segments: bool = False,
    unroll: int | None = None,
    stationary: bool = False,
    channel_vectors: bool = False,
    *,
    tuning: ElementwiseKernelTuning,
    tiled: bool = False,
) -> ElementwiseKernel:
    """The kernel for ``op`` reading ``a`` (and ``b``), writing ``out`` under ``tuning`` (built once per
    key of what it compiles, compiled on first use: tuning values that differ only in what this kernel does
    not read share it).

    ``uniform_chunk`` says every chunk lies in one scale segment (``seg_len % G == 0``), so scales
    are read once per chunk. ``grid`` is the FP8 element of an FP8 op (see :func:`op_functions`):
    its kernels read no zero points. ``pow2_segments`` (uniform chunks only) says ``seg_len / G`` is a
    power of two: the segment of chunk ``c`` is ``c >> log2(seg_len / G)``, with no per-thread
    tracking (``step_q`` / ``step_r`` unused); in channel mode the caller guarantees that the channel
    axis is the outermost (``n == channels * seg_len``), so that no modulo applies. ``unroll``: the
    chunks a thread has in flight, for kernels without power-of-two segments (default ``tuning.unroll``;
    ``tuning.narrow_input_bytes`` may raise it, and the shift kernels' is ``tuning.pow2_unroll``).
    ``stationary`` (channel mode, chunks spanning channels): the thread-stationary kernel, for a grid
    whose stride is a whole number of channel periods (``step_q == step_r == 0``), so that every chunk
    of a thread sees the same ``G`` channels and loads their parameters once. It is a kernel of its
    own, without the general loop: at 32-40 registers against 56-62 with that loop in it, it holds
    more threads per SM. ``channel_vectors`` (channel mode along the last axis: ``seg_len == 1``,
    ``channels % G == 0``): each chunk's ``G`` channels are consecutive, so their scales and zero points
    are read as vectors (aligned to ``G`` elements, up to 16 bytes, which the caller guarantees) next
    to the chunk, for grids of short-lived blocks. ``tiled`` (a shift kernel of ``tuning.pow2_tiled_unroll``
    chunks a thread, a power of two, whose caller guarantees segments of at least that many chunks): each segment
    is taken by ``lanes = segment chunks / unroll`` consecutive threads, thread ``g`` holding chunks
    ``(g // lanes) * segment chunks + g % lanes + k * lanes``, all in one segment, whose parameters it loads and
    inverts once per round (a warp's loads stay runs of ``lanes`` consecutive chunks).
    """
    G = chunk_elements(a, b, out)
    scalar = mode is ScaleMode.SCALAR
    shifted = pow2_segments and not scalar and uniform_chunk
    tiled = tiled and shifted and tuning.pow2_tiled_unroll > 1
    unroll = (tuning.pow2_tiled_unroll if tiled else tuning.pow2_unroll) if shifted else (unroll or tuning.unroll)
    # Not the shift kernels, whose one chunk in flight (pow2_unroll) was measured best on both cards: raising it for
    # narrow inputs took an H200's f32 per-token / group-128 / axis-0 dequantize from 87-88% of copy to 76-79%.
    if tuning.narrow_input_bytes and a.itemsize < out.itemsize and not stationary and not shifted:
        unroll = max(unroll, tuning.narrow_input_bytes // (G * a.itemsize))
    # aw holds uint64 pairs; a tiled kernel's next chunks are not a grid stride ahead
    prefetch = tuning.pow2_prefetch if shifted and not tiled and G * a.itemsize == 16 else 0
    depth = max(2, tuning.stationary_input_bytes // (G * (a.itemsize + (b.itemsize if b is not None else 0))))
    if channel_vectors:
        depth = unroll
    per_element_params = not scalar and not uniform_chunk
    spans_channels = mode is ScaleMode.CHANNELS and per_element_params and not channel_vectors
    bounds = tuning.general_launch_bounds
    if spans_channels:
        bounds = tuning.channel_launch_bounds
    if stationary:
        bounds = tuning.stationary_launch_bounds
    pow2_bounds = None
    if shifted and tuning.pow2_launch_bounds and precision is not MathPrecision.F64:
        bounds = pow2_bounds = tuning.pow2_launch_bounds
    elif shifted:
        bounds = None
    resident = tuning.stationary_launch_bounds[1] if stationary else 0
    return _elementwise_kernel(op, a, b, out, precision, mode, uniform_chunk, grid, shifted, unroll, stationary,
                               channel_vectors, prefetch, depth, bounds, pow2_bounds, resident, tiled)


@functools.cache
def _elementwise_kernel(op: ElementwiseOp, a: ElementKind, b: ElementKind | None, out: ElementKind,
                        precision: MathPrecision, mode: ScaleMode, uniform_chunk: bool, grid: ElementKind | None,
                        shifted: bool, unroll: int, stationary: bool, channel_vectors: bool, prefetch: int,
                        depth: int, bounds: tuple[int, int] | None, pow2_bounds: tuple[int, int] | None,
                        resident: int, tiled: bool = False) -> ElementwiseKernel:
    """:func:`elementwise_kernel` once its tuning is resolved: ``unroll`` chunks in flight, L2 prefetches
    ``prefetch`` strides ahead (shift kernels), ``depth`` chunks in flight of the stationary and
    channel-vector loops, ``bounds`` the launch bounds (``pow2_bounds``: those of a shift kernel, which its
    name tags), ``resident`` the stationary kernel's blocks per SM.

    One long function for the reason :func:`~baracuda_numba.kernels.dynamic.dynamic_kernels` gives: the kernel
    bodies are closures over this combination's constants, which numba compiles in."""
    M = math_type(precision)
    compute = op_functions(precision, grid)[op]
    G = chunk_elements(a, b, out)
    a_codec, out_codec = codec(a, precision), codec(out, precision)
    b_codec = codec(b, precision) if b is not None else a_codec
    has_b = b is not None
    a_bits, b_bits, o_bits = 8 * a.itemsize, 8 * (b or a).itemsize, 8 * out.itemsize
    a_load, _ = chunk_io(G * a.itemsize)
    b_load, _ = chunk_io(G * (b or a).itemsize)
    _, o_store = chunk_io(G * out.itemsize)
    a_decode, b_decode, o_encode = a_codec.decode, b_codec.decode, out_codec.encode
    scalar = mode is ScaleMode.SCALAR
    channels_mode = mode is ScaleMode.CHANNELS
    per_element_params = not scalar and not uniform_chunk
    if (stationary or channel_vectors) and not (channels_mode and per_element_params):
        raise ValueError("thread-stationary and channel-vector kernels are for channel scales with chunks "
                         "spanning channels")
    copy_params = device.vector_copy(G)
    zero = M(0.0)
    word_zero = np.uint64(0)
    u64 = np.uint64
    prefetch_l2 = memory.prefetch_l2
    vector_slots = depth * G  # the parameters of the chunks in flight (channel vectors)

    reads_zero_points = op is not ElementwiseOp.DEQUANTIZE_BACKWARD and grid is None

    reciprocal = device.reciprocal
    byte = u64(0xFF)
    integer_quantize = op is ElementwiseOp.QUANTIZE and grid is None and out in (ElementKind.S8, ElementKind.U8)
    pack_bytes4 = device.pack_bytes4
    pair_encode = out_codec.encode_pair
    pairs = pair_encode is not None and G % 2 == 0

    @device_function
    def element_bits(x, y, inv, sc, zp, q_min, q_max):
        """The output element's bits (integer quantize through :func:`quantize_int`)."""
        if integer_quantize:
            return u64(quantize_int(x, inv, zp, q_min, q_max)) & byte
        return o_encode(compute(x, y, inv, sc, zp, q_min, q_max))

    @device_function
    def segment_params(scales, zero_points, s):
        sc = scales[s]
        inv = reciprocal(sc) if sc != zero else zero
        return inv, sc, (M(zero_points[s]) if reads_zero_points else zero)

    @device_function
    def segment_of(i, seg_len, channels):
        s = i // seg_len
        pos = i - s * seg_len
        if channels_mode:
            s = s % channels
        return s, pos

    @device_function
    def advance(s, pos, step_q, step_r, seg_len, channels):
        """Move ``(segment, position)`` forward by ``step_q * seg_len + step_r`` elements
        (``step_q`` already reduced modulo ``channels`` in channel mode): no division."""
        pos += step_r
        s += step_q
        if pos >= seg_len:
            pos -= seg_len
            s += 1
        if channels_mode and s >= channels:
            s -= channels
        return s, pos

    @device_function
    def lane(lo, hi, bit):
        return (lo if bit < 64 else hi) >> u64(bit % 64)

    @device_function
    def place(o_lo, o_hi, e, bit):
        if bit < 64:
            o_lo |= e << u64(bit)
        else:
            o_hi |= e << u64(bit - 64)
        return o_lo, o_hi

    @device_function
    def chunk_lane(o_lo, o_hi, pending, a_lo, a_hi, b_lo, b_hi, j, inv, sc, zp, q_min, q_max):
        """Element ``j`` of a chunk computed and placed in the output words. 16-bit float outputs
        are encoded two at a time: an even ``j`` returns its value as ``pending`` for ``j + 1``."""
        x = a_decode(lane(a_lo, a_hi, j * a_bits))
        y = zero
        if has_b:
            y = b_decode(lane(b_lo, b_hi, j * b_bits))
        if pairs:
            v = compute(x, y, inv, sc, zp, q_min, q_max)
            if j % 2 == 1:
                o_lo, o_hi = place(o_lo, o_hi, pair_encode(pending, v), (j - 1) * o_bits)
            pending = v
        else:
            o_lo, o_hi = place(o_lo, o_hi, element_bits(x, y, inv, sc, zp, q_min, q_max), j * o_bits)
        return o_lo, o_hi, pending

    # int8 outputs of a chunk four to a word through pack_bytes4 (three prmt per four bytes, against
    # a 64-bit mask, shift and or per byte through ``place``). Not in the kernels that track their
    # segment: there NVVM gave the bf16 kernel 48 registers against 40, two 512-thread blocks per SM
    # instead of three, and group-128 quantize fell from 81.6% to 70.0% of copy (H100, 2026-11-23).
    byte_words = integer_quantize and G >= 4 and (scalar or shifted or stationary or channel_vectors)

    @device_function
    def quantized(a_lo, a_hi, j, inv, zp, q_min, q_max):
        return quantize_int(a_decode(lane(a_lo, a_hi, j * a_bits)), inv, zp, q_min, q_max)

    @device_function
    def byte_word(a_lo, a_hi, j, inv0, zp0, inv1, zp1, inv2, zp2, inv3, zp3, q_min, q_max):
        """Integer outputs ``j .. j + 3`` of a chunk (each under its own parameters) in one word."""
        return pack_bytes4(quantized(a_lo, a_hi, j, inv0, zp0, q_min, q_max),
                           quantized(a_lo, a_hi, j + 1, inv1, zp1, q_min, q_max),
                           quantized(a_lo, a_hi, j + 2, inv2, zp2, q_min, q_max),
                           quantized(a_lo, a_hi, j + 3, inv3, zp3, q_min, q_max))

    @device_function
    def quantize_chunk_bytes(a_lo, a_hi, inv, zp, q_min, q_max):
        """The chunk's G integer outputs under one scale and zero point, four bytes per word."""
        o_lo, o_hi = word_zero, word_zero
        for w in range(G // 4):
            word = byte_word(a_lo, a_hi, 4 * w, inv, zp, inv, zp, inv, zp, inv, zp, q_min, q_max)
            o_lo, o_hi = place(o_lo, o_hi, word, 32 * w)
        return o_lo, o_hi

    @device_function
    def stationary_chunk(a_lo, a_hi, b_lo, b_hi, e_inv, e_scale, e_zp, q_min, q_max):
        """A chunk whose G elements use the thread's fixed parameters: a loop small enough for NVVM
        to unroll, so ``e_*[j]`` are registers (ncu showed local-memory traffic, 64% L1 hits, while
        this loop shared its body with the per-element parameter updates)."""
        o_lo, o_hi, pending = word_zero, word_zero, zero
        if byte_words:
            for w in range(G // 4):
                j = 4 * w
                word = byte_word(a_lo, a_hi, j, e_inv[j], e_zp[j], e_inv[j + 1], e_zp[j + 1], e_inv[j + 2],
                                 e_zp[j + 2], e_inv[j + 3], e_zp[j + 3], q_min, q_max)
                o_lo, o_hi = place(o_lo, o_hi, word, 32 * w)
        else:
            for j in range(G):
                o_lo, o_hi, pending = chunk_lane(o_lo, o_hi, pending, a_lo, a_hi, b_lo, b_hi, j, e_inv[j],
                                                 e_scale[j], e_zp[j], q_min, q_max)
        return o_lo, o_hi

    @device_function
    def load_ab(aw, bw, c):
        """Chunk ``c`` of ``a`` and (zero words without one) of ``b``."""
        a_lo, a_hi = a_load(aw, c)
        b_lo, b_hi = word_zero, word_zero
        if has_b:
            b_lo, b_hi = b_load(bw, c)
        return a_lo, a_hi, b_lo, b_hi

    unroll_log2 = unroll.bit_length() - 1  # tiles: unroll is a power of two (elementwise_kernel)

    def kernel(aw, ae, bw, be, ow, oe, scales, zero_points, n, nchunks, seg_len, channels, step_q, step_r,
               inv0, scale0, zp0, q_min, q_max):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        a_lo = cuda.local.array(unroll, np.uint64)
        a_hi = cuda.local.array(unroll, np.uint64)
        b_lo = cuda.local.array(unroll, np.uint64)
        b_hi = cuda.local.array(unroll, np.uint64)
        k_inv = cuda.local.array(unroll, M)
        k_scale = cuda.local.array(unroll, M)
        k_zp = cuda.local.array(unroll, M)
        k_seg = cuda.local.array(unroll, np.int64)
        k_pos = cuda.local.array(unroll, np.int64)
        inv, sc, zp = inv0, scale0, zp0
        # Segment of this thread's next chunk, tracked incrementally (one division per thread).
        seg, seg_pos = 0, 0
        shift = 0
        # log2(seg_len / G), seg_len / G a power of two: one popc, no loop (docs/design.md, "Instructions per byte")
        if shifted:
            shift = cuda.popc(seg_len // G - 1)
        elif channel_vectors:  # seg_len == 1: the channel of element start * G
            seg = (start * G) % channels
        elif not scalar:
            seg, seg_pos = segment_of(start * G, seg_len, channels)
        # Thread-stationary channels: one grid stride spans a whole number of channel periods
        # (step_q == step_r == 0): every chunk of this thread sees the same G channels, so their
        # parameters are loaded (and inverted) once per thread, not once per element.
        e_inv = cuda.local.array(G, M)
        e_scale = cuda.local.array(G, M)
        e_zp = cuda.local.array(G, M)
        if stationary:
            s, pos = seg, seg_pos
            for j in range(G):
                e_inv[j], e_scale[j], e_zp[j] = segment_params(scales, zero_points, s)
                s, pos = advance(s, pos, 0, 1, seg_len, channels)
        # The stationary and channel-vector loops have ``depth`` chunks in flight (and, with channel
        # vectors, their scales and zero points), in arrays that NVVM keeps in registers (constant
        # indices once the loops over ``k`` are unrolled); the general loop's per-chunk arrays stay in
        # local memory in these kernels (NVVM does not unroll it around the per-element parameter
        # updates), which ncu showed as 71% L1 hits on quantize_backward.
        s_lo = cuda.local.array(depth, np.uint64)
        s_hi = cuda.local.array(depth, np.uint64)
        s_b_lo = cuda.local.array(depth, np.uint64)
        s_b_hi = cuda.local.array(depth, np.uint64)
        v_scale = cuda.local.array(vector_slots, M)
        v_zp = cuda.local.array(vector_slots, np.int32)
        c = start
        while (stationary or channel_vectors) and c < nchunks:
            count = depth if c + (depth - 1) * stride < nchunks else 1  # the last chunks one at a time
            for k in range(depth):
                if k < count:
                    s_lo[k], s_hi[k], s_b_lo[k], s_b_hi[k] = load_ab(aw, bw, c + k * stride)
                    if channel_vectors:  # the chunk's G channels start at seg, a multiple of G
                        copy_params(v_scale, k * G, scales, seg)
                        if reads_zero_points:
                            copy_params(v_zp, k * G, zero_points, seg)
                        seg, seg_pos = advance(seg, seg_pos, step_q, step_r, seg_len, channels)
            for k in range(depth):
                if k < count:
                    if channel_vectors:
                        for j in range(G):
                            sc = v_scale[k * G + j]
                            e_inv[j] = reciprocal(sc) if sc != zero else zero
                            e_scale[j] = sc
                            e_zp[j] = M(v_zp[k * G + j]) if reads_zero_points else zero
                    o_lo, o_hi = stationary_chunk(s_lo[k], s_hi[k], s_b_lo[k], s_b_hi[k], e_inv, e_scale, e_zp,
                                                  q_min, q_max)
                    o_store(ow, c + k * stride, o_lo, o_hi)
            c += count * stride
        # while loops, not range(): a range with a run-time step computes its trip count by a division
        # (docs/design.md, "Instructions per byte")
        # Tiles (elementwise_kernel, ``tiled``): thread g takes chunks base + k * lanes of one segment, lanes =
        # segment chunks / unroll consecutive threads sharing each segment.
        lanes_shift = shift - unroll_log2 if tiled else 0
        lanes_mask = (np.int64(1) << lanes_shift) - 1
        g = np.int64(start)
        base = ((g >> lanes_shift) << shift) + (g & lanes_mask) if tiled else g
        while base < (0 if stationary or channel_vectors else nchunks):
            if prefetch:
                ahead = base + prefetch * unroll * stride
                if ahead < nchunks:
                    prefetch_l2(aw, ahead)
            if tiled:
                inv, sc, zp = segment_params(scales, zero_points, base >> shift)
            for k in range(unroll):
                c = base + (k << lanes_shift if tiled else k * stride)
                if c < nchunks:
                    a_lo[k], a_hi[k] = a_load(aw, c)
                    if has_b:
                        b_lo[k], b_hi[k] = b_load(bw, c)
                    if tiled:  # the round's parameters, loaded above
                        pass
                    elif shifted:
                        k_inv[k], k_scale[k], k_zp[k] = segment_params(scales, zero_points, c >> shift)
                    elif not scalar and not stationary:  # the chunk's scale loads overlap the data loads
                        k_seg[k], k_pos[k] = seg, seg_pos
                        k_inv[k], k_scale[k], k_zp[k] = segment_params(scales, zero_points, seg)
                        seg, seg_pos = advance(seg, seg_pos, step_q, step_r, seg_len, channels)
            for k in range(unroll):
                c = base + (k << lanes_shift if tiled else k * stride)
                if c < nchunks:
                    s, pos = 0, 0
                    if tiled:
                        pass
                    elif shifted:
                        inv, sc, zp = k_inv[k], k_scale[k], k_zp[k]
                    elif not scalar and not stationary:
                        s, pos = k_seg[k], k_pos[k]
                        inv, sc, zp = k_inv[k], k_scale[k], k_zp[k]
                    if byte_words and not per_element_params:
                        o_lo, o_hi = quantize_chunk_bytes(a_lo[k], a_hi[k], inv, zp, q_min, q_max)
                        o_store(ow, c, o_lo, o_hi)
                        continue
                    o_lo, o_hi, pending = word_zero, word_zero, zero
                    for j in range(G):
                        if per_element_params and j > 0:
                            pos += 1
                            if pos == seg_len:
                                pos = 0
                                s += 1
                                if channels_mode and s == channels:
                                    s = 0
                                inv, sc, zp = segment_params(scales, zero_points, s)
                        o_lo, o_hi, pending = chunk_lane(o_lo, o_hi, pending, a_lo[k], a_hi[k], b_lo[k], b_hi[k], j,
                                                         inv, sc, zp, q_min, q_max)
                    o_store(ow, c, o_lo, o_hi)
            if tiled:
                g += stride
                base = ((g >> lanes_shift) << shift) + (g & lanes_mask)
            else:
                base += stride * unroll
        i = nchunks * G + start
        while i < n:
            if not scalar:
                s, pos = segment_of(i, seg_len, channels)
                inv, sc, zp = segment_params(scales, zero_points, s)
            x = a_decode(u64(ae[i]))
            y = zero
            if has_b:
                y = b_decode(u64(be[i]))
            oe[i] = element_bits(x, y, inv, sc, zp, q_min, q_max)
            i += stride

    m = "float64" if precision is MathPrecision.F64 else "float32"
    b_elem = b or a

    def views(element: ElementKind) -> str:
        return f"{uint_name(chunk_view_itemsize(G * element.itemsize))}[::1], {uint_name(element.itemsize)}[::1]"

    signature = (
        f"void({views(a)}, {views(b_elem)}, {views(out)}, {m}[::1], int32[::1], "
        f"int64, int64, int64, int64, int64, int64, {m}, {m}, {m}, {m}, {m})"
    )
    grid_tag = f"_{grid.short}" if grid else ""
    if stationary:
        grid_tag += "_stationary" + (f"_d{depth}" if depth != 2 else "")
    if channel_vectors:
        grid_tag += "_vectors"
    pow2_tag = (f"_pow2_u{unroll}" + (f"_pf{prefetch}" if prefetch else "") + ("_tiled" if tiled else "") if shifted
                else ("" if unroll == _UNTAGGED_UNROLL else f"_u{unroll}"))
    if pow2_bounds:
        pow2_tag += f"_lb{pow2_bounds[1]}"
    elif bounds and (bounds != (512, 2) or not per_element_params):  # all but an H100's channel kernels'
        pow2_tag += f"_lb{bounds[0]}x{bounds[1]}"
    kernel.__name__ = f"{op.value}_{a.short}_{b_elem.short}_{out.short}_{mode.value}{grid_tag}{pow2_tag}"
    kernel.__qualname__ = kernel.__name__
    options = (("launch_bounds", bounds),) if bounds else ()
    return ElementwiseKernel(kernel, signature, a, b, out, precision, G, options, unroll, resident)
