"""Device primitives the kernels are written in: rounding and bit-level conversions.

On the GPU each is an LLVM intrinsic (one or two PTX instructions); under Numba's CUDA simulator,
which cannot run intrinsics, the same names are NumPy functions with the same results. Every
conversion takes and returns bit patterns in ``uint64`` so that kernel code never mixes signed and
unsigned integers (Numba types that mix as float64).

- ``rint(x)``: round half to even, in the precision of ``x`` (``cvt.rni``).
- ``bits_to_f32(w)`` / ``f32_to_bits(x)``: reinterpret the low 32 bits.
- ``bits_to_f64(w)`` / ``f64_to_bits(x)``: reinterpret 64 bits.
- ``f16_bits_to_f32(w)`` / ``f32_to_f16_bits(x)``: IEEE half from / to the low 16 bits (RNE).
- ``bf16_bits_to_f32(w)`` / ``f32_to_bf16_bits(x)``: bfloat16 from / to the low 16 bits (RNE,
  NaN kept quiet with its sign).
- ``bits_to_s8(w)`` / ``bits_to_u8(w)``: the low byte as a signed / unsigned integer (int64).
- ``int_to_bits(q)``: an integral float to its two's-complement bits (uint64, not masked).
- ``round_to_int(x)``: ``x`` rounded half to even to an int32 (``cvt.rni.s32``, one conversion-pipe
  instruction): NaN gives 0, values past the int32 range (+-inf included) saturate to its ends.
- ``max_s16x2(a, b)``: the lane-wise maximum of two pairs of signed 16-bit integers packed in the low
  32 bits of ``a`` and ``b`` (``max.s16x2``, sm_90; one instruction for two lanes); uint64 result.
- ``max_bf16x2(a, b)`` / ``min_bf16x2(a, b)`` / ``max_f16x2(a, b)`` / ``min_f16x2(a, b)``: lane-wise
  maximum / minimum of two pairs of 16-bit floats in the low 32 bits (``max.bf16x2`` ...; callers
  pass no NaN); uint64 result.
- ``clamp_s32(q, lo, hi)``: ``min(max(q, lo), hi)`` in 32-bit integers (``max.s32`` / ``min.s32``;
  Numba's own integer ``min`` / ``max`` widen to 64 bits, two instructions each).
- ``pack_bytes4(a, b, c, d)``: the low bytes of four integers packed into one 32-bit word, ``a``
  lowest (three ``prmt``); uint64 result.
- ``pack_s4_pair(hi, lo, rest)`` / ``pack_u4_pair(hi, lo, rest)``: ``rest << 8 | hi << 4 | lo`` in 32
  bits, ``hi`` and ``lo`` saturated to the 4-bit range ([-8, 7] / [0, 15]) and kept to their nibbles
  (``cvt.pack.sat.{s4,u4}.s32.b32``: one instruction per byte of two nibbles, against a mask, a shift
  and an or per nibble); uint64 result. Chained from the highest pair down, they pack a word.
- ``clamp_nan_f32(x, lo, hi)``: ``min(max(x, lo), hi)`` of float32 values with NaN kept NaN
  (``max.NaN`` / ``min.NaN``, one instruction each against a compare and a select).
- ``f32x2_to_bf16x2_bits(lo, hi)`` / ``f32x2_to_f16x2_bits(lo, hi)``: two float32 values rounded to
  nearest even into one 32-bit word, ``lo`` in bits 0-15 (``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32``:
  one ``F2FP`` instruction for two elements, against five integer-pipe instructions per bfloat16
  through the bits). The same bits as two ``f32_to_bf16_bits`` / ``f32_to_f16_bits``, NaN aside: a
  NaN becomes a NaN (the instruction writes the canonical one; GPU arithmetic hands the encoders
  canonical NaNs only, so in practice the same bits there too).
- ``f32x2_to_e4m3x2_bits(hi, lo)`` / ``f32x2_to_e5m2x2_bits(hi, lo)``: two float32 values to FP8 in
  one ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (``lo`` in bits 0-7, ``hi`` in bits 8-15), each NaN
  given its input's sign back (PyTorch's encoding). GPU only: the simulator composes
  ``codecs.fp8_bits_codec``'s model of the instruction.
- ``reciprocal(x)``: ``1 / x`` correctly rounded in the precision of ``x`` (``rcp.rn``: the same
  bits as an IEEE division, fewer instructions).
- ``add_rn(x, y)``: ``x + y`` rounded on its own (``add.rn``), never fused with the multiply that
  produced ``x`` into an FMA as NVVM otherwise does: the sum a NumPy reference computes.
- ``shuffle_xor(value, offset, scratch, tid)``: the value of lane ``lane ^ offset`` of the warp
  (``shfl.sync.bfly``). Under the simulator, which has no warp intrinsics, it goes through the
  block's shared ``scratch`` with two barriers, so every thread of the block must call it alike.
- ``mma_s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, tid)``: one warp-wide
  ``mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`` (int8 tensor cores, exact int32 accumulation);
  fragments as the PTX ISA lays them out (lane = 4 * group + t: ``a0`` row ``group`` bytes
  ``4t..4t+3``, ``a1`` row ``group + 8``, ``a2`` / ``a3`` the same rows at ``16 + 4t``; ``b0`` / ``b1``
  column ``group`` at ``4t`` / ``16 + 4t``; ``c0, c1`` row ``group`` columns ``2t, 2t + 1``, ``c2, c3``
  row ``group + 8``). The simulator computes it through the block's shared ``scratch``
  (``[threads, 6]`` int32), so every thread of the block must call it alike.
- ``load_u64x2(words, c)`` / ``store_u64x2(words, c, lo, hi)``: words ``2c`` and ``2c + 1`` of a
  uint64 array as one 16-byte access (``ld/st.global.v2.u64``; numba never emits these itself).
- ``load_u64x2_streaming(words, c)``: the same words through the read-only path, not kept in L1 and with
  256-byte L2 prefetch (``ld.global.nc.L1::no_allocate.L2::256B.v2.u64``): for inputs no kernel writes
  while the reading kernel runs.
- ``hinted_load_u64x2(hint)``: ``load(words, c)``, :func:`load_u64x2` with the cache operators ``hint``
  names (a key of ``LOAD_HINTS``; ``""``: none): ``"na"`` ``ld.global.L1::no_allocate`` (the line is not
  kept in L1, so it evicts nothing there), ``"ef"`` ``.L1::evict_first``, ``"nc_na"`` the read-only path
  and no L1 allocation (for data no kernel writes while the reading kernel runs); ``"l2_256"``,
  ``"na_l2_128"``, ``"na_l2_256"``: L2's prefetch size (``.L2::128B`` / ``.L2::256B``: a miss fills that
  much of the line's neighbourhood from DRAM), alone or with no L1 allocation. The load is ordered
  with the kernel's other side-effecting instructions (``griddepcontrol.wait`` among them). The simulator
  loads plainly.
- ``vector_copy(count)``: the device function ``copy(dst, at, src, i)`` that reads ``src[i .. i + count)``
  (a global array) as one vector access and writes it into ``dst[at .. at + count)``, a local array (which NVVM keeps
  in registers where its indices are constant). The address of ``src[i]`` must be a multiple of
  ``min(count * itemsize, 16)``: ``ld.global.v4.f32`` for four float32, two of them for eight.
"""

from __future__ import annotations

import functools

import numpy as np

from ..platform import SIMULATOR

__all__ = [
    "device_function",
    "rint",
    "bits_to_f32",
    "f32_to_bits",
    "bits_to_f64",
    "f64_to_bits",
    "f16_bits_to_f32",
    "f32_to_f16_bits",
    "bf16_bits_to_f32",
    "f32_to_bf16_bits",
    "bits_to_s8",
    "bits_to_u8",
    "int_to_bits",
    "load_u64x2",
    "hinted_load_u64x2",
    "LOAD_HINTS",
    "store_u64x2",
    "reciprocal",
    "round_to_int",
    "max_s16x2",
    "clamp_s32",
    "pack_bytes4",
    "pack_s4_pair",
    "pack_u4_pair",
    "max_bf16x2",
    "min_bf16x2",
    "max_f16x2",
    "min_f16x2",
    "clamp_nan_f32",
    "f32x2_to_bf16x2_bits",
    "f32x2_to_f16x2_bits",
    "add_rn",
    "shuffle_xor",
    "mma_s8",
    "vector_copy",
]

# hinted_load_u64x2's cache operators, by name
LOAD_HINTS = {"": "", "na": ".L1::no_allocate", "ef": ".L1::evict_first", "nc_na": ".nc.L1::no_allocate",
              "l2_256": ".L2::256B", "na_l2_128": ".L1::no_allocate.L2::128B", "na_l2_256": ".L1::no_allocate.L2::256B"}

if SIMULATOR:
    _M32 = 0xFFFFFFFF

    def device_function(fn):
        """Simulator: a plain Python function. (Simulated device functions re-swap their module's
        ``cuda`` under a lock on every call, which thirty-two contending threads make very slow.)"""
        return fn

    def rint(x):
        return np.rint(x)

    def bits_to_f32(w):
        return np.uint32(int(w) & _M32).view(np.float32)

    def f32_to_bits(x):
        return np.uint64(np.float32(x).view(np.uint32))

    def bits_to_f64(w):
        return np.uint64(w).view(np.float64)

    def f64_to_bits(x):
        return np.float64(x).view(np.uint64)

    def f16_bits_to_f32(w):
        return np.float32(np.uint16(int(w) & 0xFFFF).view(np.float16))

    def f32_to_f16_bits(x):
        return np.uint64(np.float16(np.float32(x)).view(np.uint16))

    def bf16_bits_to_f32(w):
        return np.uint32((int(w) & 0xFFFF) << 16).view(np.float32)

    def f32_to_bf16_bits(x):
        bits = int(np.float32(x).view(np.uint32))
        if (bits & 0x7FFFFFFF) > 0x7F800000:
            return np.uint64((bits >> 16) | 0x0040)
        return np.uint64(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)

    def bits_to_s8(w):
        b = int(w) & 0xFF
        return np.int64(b - 256 if b > 127 else b)

    def bits_to_u8(w):
        return np.int64(int(w) & 0xFF)

    def int_to_bits(q):
        return np.uint64(int(q) & 0xFFFFFFFFFFFFFFFF)

    def reciprocal(x):
        return type(x)(1.0) / x

    def round_to_int(x):
        if x != x:
            return np.int32(0)
        return np.int32(min(max(float(np.rint(x)), -2.0**31), 2.0**31 - 1))  # in float64: 2**31 - 1 is exact

    def _s16(v):
        return v - 0x10000 if v & 0x8000 else v

    def max_s16x2(a, b):
        lanes = [max(_s16((int(a) >> s) & 0xFFFF), _s16((int(b) >> s) & 0xFFFF)) & 0xFFFF for s in (0, 16)]
        return np.uint64(lanes[0] | (lanes[1] << 16))

    def clamp_s32(q, lo, hi):
        return np.int32(min(max(int(q), int(lo)), int(hi)))

    def _half_lanes(pick, to_float):
        def lanes(a, b):
            out = 0
            for shift in (0, 16):
                x, y = (int(a) >> shift) & 0xFFFF, (int(b) >> shift) & 0xFFFF
                out |= (x if pick(to_float(x), to_float(y)) else y) << shift
            return np.uint64(out)

        return lanes

    def _bf16(v):
        return float(np.uint32(v << 16).view(np.float32))

    def _f16(v):
        return float(np.uint16(v).view(np.float16))

    max_bf16x2 = _half_lanes(lambda x, y: x >= y, _bf16)
    min_bf16x2 = _half_lanes(lambda x, y: x <= y, _bf16)
    max_f16x2 = _half_lanes(lambda x, y: x >= y, _f16)
    min_f16x2 = _half_lanes(lambda x, y: x <= y, _f16)

    def pack_bytes4(a, b, c, d):
        return np.uint64((int(a) & 0xFF) | (int(b) & 0xFF) << 8 | (int(c) & 0xFF) << 16 | (int(d) & 0xFF) << 24)

    def _nibble_pair(low: int, high: int):
        def pair(hi, lo, rest):
            sat = [min(max(int(v), low), high) & 0xF for v in (hi, lo)]
            return np.uint64(((int(rest) << 8) | (sat[0] << 4) | sat[1]) & 0xFFFFFFFF)

        return pair

    pack_s4_pair, pack_u4_pair = _nibble_pair(-8, 7), _nibble_pair(0, 15)

    def clamp_nan_f32(x, lo, hi):
        if x != x:
            return x
        return np.float32(min(max(x, lo), hi))

    def f32x2_to_bf16x2_bits(lo, hi):
        return np.uint64(int(f32_to_bf16_bits(lo)) | int(f32_to_bf16_bits(hi)) << 16)

    def f32x2_to_f16x2_bits(lo, hi):
        return np.uint64(int(f32_to_f16_bits(lo)) | int(f32_to_f16_bits(hi)) << 16)

    def add_rn(x, y):
        return x + y

    from numba import cuda

    @cuda.jit(device=True)  # a simulated device function: its `cuda` is the simulator's
    def shuffle_xor(value, offset, scratch, tid):
        scratch[tid] = value
        cuda.syncthreads()
        other = scratch[tid ^ offset]
        cuda.syncthreads()
        return other

    def _byte(word, i):
        b = (int(word) >> (8 * i)) & 0xFF
        return b - 256 if b > 127 else b

    @cuda.jit(device=True)  # simulated: all 32 lanes' fragments meet in shared memory
    def mma_s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, tid):
        for i, value in enumerate((a0, a1, a2, a3, b0, b1)):
            scratch[tid, i] = np.uint32(value).view(np.int32)
        cuda.syncthreads()
        warp = tid - tid % 32
        lane = tid % 32
        group, t = lane // 4, lane % 4
        out = [c0, c1, c2, c3]
        for slot in range(4):
            row = group + (8 if slot >= 2 else 0)
            col = 2 * t + slot % 2
            total = 0
            for k in range(32):
                a_lane = warp + 4 * (row % 8) + (k % 16) // 4
                a_reg = (0 if row < 8 else 1) + (2 if k >= 16 else 0)
                b_lane = warp + 4 * col + (k % 16) // 4
                b_reg = 4 + (1 if k >= 16 else 0)
                total += _byte(scratch[a_lane, a_reg], k % 4) * _byte(scratch[b_lane, b_reg], k % 4)
            out[slot] = np.int32(np.int64(out[slot]) + total)
        cuda.syncthreads()
        return out[0], out[1], out[2], out[3]

    def load_u64x2(words, c):
        return words[2 * c], words[2 * c + 1]

    load_u64x2_streaming = load_u64x2  # a cache hint: the same words

    def hinted_load_u64x2(hint: str):
        if hint not in LOAD_HINTS:
            raise ValueError(f"hinted_load_u64x2: a hint of {sorted(LOAD_HINTS)}, not {hint!r}")
        return load_u64x2  # cache hints: the same words

    @functools.cache
    def vector_copy(count: int):
        def copy(dst, at, src, i):
            for j in range(count):
                dst[at + j] = src[i + j]

        return copy

    def store_u64x2(words, c, lo, hi):
        words[2 * c] = lo
        words[2 * c + 1] = hi

else:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    _I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)

    def _to_i64(builder, value, ty):
        """Any integer argument as an i64 (sign- or zero-extended, or truncated)."""
        if ty.bitwidth == 64:
            return value
        return builder.sext(value, _I64) if ty.signed else builder.zext(value, _I64)

    def _libdevice(name):
        """Codegen calling the libdevice function ``name`` whose arguments and result share one float type."""

        def codegen(context, builder, sig, args):
            llty = args[0].type
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(llty, [llty] * len(args)), name)
            return builder.call(fn, list(args))

        return codegen

    @intrinsic
    def rint(typingctx, x):
        if not isinstance(x, types.Float):
            return None

        # libdevice's rint (cvt.rni): NVVM rejects llvm.rint / llvm.nearbyint.
        return x(x), _libdevice("__nv_rint" if x == types.float64 else "__nv_rintf")

    @intrinsic
    def reciprocal(typingctx, x):
        if not isinstance(x, types.Float):
            return None
        return x(x), _libdevice("__nv_drcp_rn" if x == types.float64 else "__nv_frcp_rn")

    @intrinsic
    def round_to_int(typingctx, x):
        if not isinstance(x, types.Float):
            return None
        def codegen(context, builder, sig, args):
            (value,) = args
            if x == types.float32:  # cvt.rni.s32.f32: NaN gives 0, out-of-range values saturate
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [value.type]),
                                                    "__nv_float2int_rn")
                return builder.call(fn, [value])
            # float64: libdevice's __nv_double2int_rn did not round half to even on an H100 (GPU test,
            # 2026-11-23), so rint, then NaN -> 0 and the int32 range spelled out before the conversion.
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(value.type, [value.type]),
                                                "__nv_rint")
            r = builder.call(fn, [value])
            r = builder.select(builder.fcmp_unordered("uno", r, r), ir.Constant(value.type, 0.0), r)
            low, high = ir.Constant(value.type, -2.0**31), ir.Constant(value.type, 2.0**31 - 1)
            r = builder.select(builder.fcmp_ordered("<", r, low), low, r)
            r = builder.select(builder.fcmp_ordered(">", r, high), high, r)
            return builder.fptosi(r, _I32)

        return types.int32(x), codegen

    def _i32(builder, value, ty):
        return builder.trunc(_to_i64(builder, value, ty), _I32)

    @intrinsic
    def clamp_s32(typingctx, q, lo, hi):
        if not all(isinstance(t, types.Integer) for t in (q, lo, hi)):
            return None

        def codegen(context, builder, sig, args):
            v, low, high = (_i32(builder, a, t) for a, t in zip(args, (q, lo, hi), strict=True))
            v = builder.select(builder.icmp_signed(">", v, low), v, low)
            return builder.select(builder.icmp_signed("<", v, high), v, high)

        return types.int32(q, lo, hi), codegen

    @intrinsic
    def clamp_nan_f32(typingctx, x, lo, hi):
        if not all(t == types.float32 for t in (x, lo, hi)):
            return None

        def codegen(context, builder, sig, args):
            f = ir.FloatType()
            asm = ir.InlineAsm(ir.FunctionType(f, [f] * 3),
                               "{ .reg .f32 t; max.NaN.f32 t, $1, $2; min.NaN.f32 $0, t, $3; }", "=f,f,f,f")
            return builder.call(asm, list(args))

        return types.float32(x, lo, hi), codegen

    def _lane_pair(op: str):
        """An intrinsic ``(a, b) -> uint64``: the PTX ``op`` on the low 32 bits of both, two 16-bit lanes."""

        @intrinsic
        def lanes(typingctx, a, b):
            if not (isinstance(a, types.Integer) and isinstance(b, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                words = [_i32(builder, v, t) for v, t in zip(args, (a, b), strict=True)]
                asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32, _I32]), f"{op} $0, $1, $2;", "=r,r,r")
                return builder.zext(builder.call(asm, words), _I64)

            return types.uint64(a, b), codegen

        return lanes

    max_s16x2 = _lane_pair("max.s16x2")
    max_bf16x2, min_bf16x2 = _lane_pair("max.bf16x2"), _lane_pair("min.bf16x2")
    max_f16x2, min_f16x2 = _lane_pair("max.f16x2"), _lane_pair("min.f16x2")

    def _f32x2_word(text: str, swap: bool):
        """An intrinsic ``(a, b) -> uint64`` of two float32 values through the inline PTX ``text``
        (``$0`` the 32-bit result, ``$1`` / ``$2`` the sources: ``a, b``, or ``b, a`` with ``swap``)."""

        @intrinsic
        def pair(typingctx, a, b):
            if not (a == types.float32 and b == types.float32):
                return None

            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(_I32, [ir.FloatType()] * 2), text, "=r,f,f")
                return builder.zext(builder.call(asm, [args[1], args[0]] if swap else list(args)), _I64)

            return types.uint64(a, b), codegen

        return pair

    # PTX puts the first source in the upper half: the (lo, hi) encoders hand it hi first.
    f32x2_to_bf16x2_bits = _f32x2_word("cvt.rn.bf16x2.f32 $0, $1, $2;", swap=True)
    f32x2_to_f16x2_bits = _f32x2_word("cvt.rn.f16x2.f32 $0, $1, $2;", swap=True)

    _PACK4 = ("{ .reg .b32 ab, cd; prmt.b32 ab, $1, $2, 0x0040; prmt.b32 cd, $3, $4, 0x0040; "
              "prmt.b32 $0, ab, cd, 0x5410; }")

    @intrinsic
    def pack_bytes4(typingctx, a, b, c, d):
        if not all(isinstance(t, types.Integer) for t in (a, b, c, d)):
            return None

        def codegen(context, builder, sig, args):
            words = [_i32(builder, v, t) for v, t in zip(args, (a, b, c, d), strict=True)]
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32] * 4), _PACK4, "=r,r,r,r,r")
            return builder.zext(builder.call(asm, words), _I64)

        return types.uint64(a, b, c, d), codegen

    def _nibble_pair(kind: str):
        @intrinsic
        def pair(typingctx, hi, lo, rest):
            if not all(isinstance(t, types.Integer) for t in (hi, lo, rest)):
                return None

            def codegen(context, builder, sig, args):
                words = [_i32(builder, v, t) for v, t in zip(args, (hi, lo, rest), strict=True)]
                asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32] * 3), f"cvt.pack.sat.{kind}.s32.b32 $0, $1, $2, $3;",
                                   "=r,r,r,r")
                return builder.zext(builder.call(asm, words), _I64)

            return types.uint64(hi, lo, rest), codegen

        return pair

    pack_s4_pair, pack_u4_pair = _nibble_pair("s4"), _nibble_pair("u4")

    @intrinsic
    def add_rn(typingctx, x, y):
        if not (isinstance(x, types.Float) and x == y):
            return None
        return x(x, y), _libdevice("__nv_dadd_rn" if x == types.float64 else "__nv_fadd_rn")

    @intrinsic
    def bits_to_f32(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            low = builder.trunc(_to_i64(builder, args[0], w), _I32)
            return builder.bitcast(low, ir.FloatType())

        return types.float32(w), codegen

    @intrinsic
    def f32_to_bits(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            return builder.zext(builder.bitcast(args[0], _I32), _I64)

        return types.uint64(x), codegen

    @intrinsic
    def bits_to_f64(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(_to_i64(builder, args[0], w), ir.DoubleType())

        return types.float64(w), codegen

    @intrinsic
    def f64_to_bits(typingctx, x):
        if x != types.float64:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], _I64)

        return types.uint64(x), codegen

    @intrinsic
    def f16_bits_to_f32(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            low = builder.trunc(_to_i64(builder, args[0], w), _I16)
            return builder.fpext(builder.bitcast(low, ir.HalfType()), ir.FloatType())

        return types.float32(w), codegen

    @intrinsic
    def f32_to_f16_bits(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            half = builder.fptrunc(args[0], ir.HalfType())  # round to nearest even
            return builder.zext(builder.bitcast(half, _I16), _I64)

        return types.uint64(x), codegen

    @intrinsic
    def bf16_bits_to_f32(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            low = builder.trunc(_to_i64(builder, args[0], w), _I32)
            return builder.bitcast(builder.shl(low, ir.Constant(_I32, 16)), ir.FloatType())

        return types.float32(w), codegen

    @intrinsic
    def f32_to_bf16_bits(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            (value,) = args
            bits = builder.bitcast(value, _I32)
            high = builder.lshr(bits, ir.Constant(_I32, 16))
            lsb = builder.and_(high, ir.Constant(_I32, 1))
            rounded = builder.lshr(
                builder.add(builder.add(bits, ir.Constant(_I32, 0x7FFF)), lsb), ir.Constant(_I32, 16)
            )
            quiet_nan = builder.or_(high, ir.Constant(_I32, 0x0040))
            is_nan = builder.fcmp_unordered("uno", value, value)
            result = builder.select(is_nan, quiet_nan, rounded)
            return builder.zext(builder.and_(result, ir.Constant(_I32, 0xFFFF)), _I64)

        return types.uint64(x), codegen

    @intrinsic
    def bits_to_s8(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            low = builder.trunc(_to_i64(builder, args[0], w), ir.IntType(8))
            return builder.sext(low, _I64)

        return types.int64(w), codegen

    @intrinsic
    def bits_to_u8(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            low = builder.trunc(_to_i64(builder, args[0], w), ir.IntType(8))
            return builder.zext(low, _I64)

        return types.int64(w), codegen

    @intrinsic
    def int_to_bits(typingctx, q):
        if not isinstance(q, types.Float):
            return None

        def codegen(context, builder, sig, args):
            # Callers pass clamped integral values: fptosi is exact and never saturates here.
            return builder.fptosi(args[0], _I64)

        return types.uint64(q), codegen

    from numba import cuda as _cuda

    def device_function(fn):
        """A device function inlined into its caller."""
        return _cuda.jit(device=True, inline="always")(fn)

    @device_function
    def shuffle_xor(value, offset, scratch, tid):
        return _cuda.shfl_xor_sync(0xFFFFFFFF, value, offset)

    _U64x2 = ir.VectorType(_I64, 2)

    def element_pointer(context, builder, array_type, array, index):
        """The LLVM pointer to element ``index`` (an i64) of a numba array value."""
        return builder.gep(context.make_array(array_type)(context, builder, array).data, [index])

    def store_pair(context, builder, pointer, low, low_type, high, high_type):
        """``low`` then ``high`` (integers, widened to 64 bits) stored as one 16-byte vector at ``pointer``."""
        vector = ir.Constant(_U64x2, ir.Undefined)
        vector = builder.insert_element(vector, _to_i64(builder, low, low_type), ir.Constant(ir.IntType(32), 0))
        vector = builder.insert_element(vector, _to_i64(builder, high, high_type), ir.Constant(ir.IntType(32), 1))
        builder.store(vector, builder.bitcast(pointer, _U64x2.as_pointer()), align=16)

    def _pair(context, builder, words, array, chunk, c):
        """The pointer to uint64 pair ``chunk`` (words ``2 chunk``, ``2 chunk + 1``) of ``array``."""
        return element_pointer(context, builder, words, array, builder.mul(_to_i64(builder, chunk, c),
                                                                           ir.Constant(_I64, 2)))

    def _is_pair_access(words, c) -> bool:
        return isinstance(words, types.Array) and words.dtype == types.uint64 and isinstance(c, types.Integer)

    @intrinsic
    def load_u64x2(typingctx, words, c):
        if not _is_pair_access(words, c):
            return None

        def codegen(context, builder, sig, args):
            pointer = builder.bitcast(_pair(context, builder, words, args[0], args[1], c), _U64x2.as_pointer())
            vector = builder.load(pointer, align=16)
            pair = [builder.extract_element(vector, ir.Constant(ir.IntType(32), i)) for i in (0, 1)]
            return context.make_tuple(builder, sig.return_type, pair)

        return types.UniTuple(types.uint64, 2)(words, c), codegen

    def _asm_pair_load(operators: str, side_effect: bool):
        """The intrinsic ``load(words, c)`` of pair ``c`` through ``ld.global<operators>.v2.u64``."""
        text = f"ld.global{operators}.v2.u64 {{$0, $1}}, [$2];"

        @intrinsic
        def load(typingctx, words, c):
            if not _is_pair_access(words, c):
                return None

            def codegen(context, builder, sig, args):
                address = builder.ptrtoint(_pair(context, builder, words, args[0], args[1], c), _I64)
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_I64, _I64]), [_I64]), text, "=l,=l,l",
                                   side_effect=side_effect)
                pair = builder.call(asm, [address])
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(pair, i) for i in (0, 1)])

            return types.UniTuple(types.uint64, 2)(words, c), codegen

        return load

    load_u64x2_streaming = _asm_pair_load(".nc.L1::no_allocate.L2::256B", False)

    @functools.cache
    def hinted_load_u64x2(hint: str):
        if hint not in LOAD_HINTS:
            raise ValueError(f"hinted_load_u64x2: a hint of {sorted(LOAD_HINTS)}, not {hint!r}")
        return _asm_pair_load(LOAD_HINTS[hint], True) if hint else load_u64x2

    @functools.cache
    def vector_copy(count: int):
        @intrinsic
        def copy(typingctx, dst, at, src, i):
            if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype
                    and isinstance(i, types.Integer) and isinstance(at, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                dst_value, offset, src_value, index = args
                element = context.get_value_type(src.dtype)
                source = context.make_array(src)(context, builder, src_value).data
                target = context.make_array(dst)(context, builder, dst_value).data
                vector_type = ir.VectorType(element, count)
                pointer = builder.bitcast(builder.gep(source, [_to_i64(builder, index, i)]), vector_type.as_pointer())
                itemsize = context.get_abi_sizeof(element)
                vector = builder.load(pointer, align=min(count * itemsize, 16))
                for j in range(count):
                    slot = builder.add(_to_i64(builder, offset, at), ir.Constant(_I64, j))
                    builder.store(builder.extract_element(vector, ir.Constant(_I32, j)), builder.gep(target, [slot]))
                return context.get_dummy_value()

            return types.void(dst, at, src, i), codegen

        return copy

    @intrinsic
    def store_u64x2(typingctx, words, c, lo, hi):
        if not _is_pair_access(words, c):
            return None

        def codegen(context, builder, sig, args):
            store_pair(context, builder, _pair(context, builder, words, args[0], args[1], c), args[2], lo, args[3], hi)
            return context.get_dummy_value()

        return types.void(words, c, lo, hi), codegen

    _MMA = (
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
    )

    @intrinsic
    def mma_s8(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, tid):
        operands = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        if not all(isinstance(op, types.Integer) for op in operands):
            return None
        result = types.UniTuple(types.int32, 4)

        def codegen(context, builder, sig, args):
            words = [builder.trunc(_to_i64(builder, value, ty), _I32)
                     for value, ty in zip(args[:10], operands, strict=True)]
            struct = ir.LiteralStructType([_I32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(struct, [_I32] * 10), _MMA, "=r,=r,=r,=r," + ",".join(["r"] * 10),
                               side_effect=True)
            out = builder.call(asm, words)
            return context.make_tuple(builder, result, [builder.extract_value(out, i) for i in range(4)])

        return result(*operands, scratch, tid), codegen


if not SIMULATOR:
    # FP8 through the conversion unit (sm_89+). The simulator has no equivalent instruction:
    # codecs.py models it with integer arithmetic there (fp8_bits_codec), and the GPU tests hold
    # both to PyTorch's conversion.

    def _f32_to_fp8(kind: str):
        # Both halves from the same value: only the low byte is kept.
        text = (f"{{ .reg .b16 pair; cvt.rn.satfinite.{kind}x2.f32 pair, $1, $1; "
                "cvt.u32.u16 $0, pair; and.b32 $0, $0, 255; }")

        @intrinsic
        def f32_to_fp8_bits(typingctx, x):
            if x != types.float32:
                return None

            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(_I32, [ir.FloatType()]), text, "=r,f")
                return builder.zext(builder.call(asm, [args[0]]), _I64)

            return types.uint64(x), codegen

        return f32_to_fp8_bits

    f32_to_e4m3_bits = _f32_to_fp8("e4m3")
    f32_to_e5m2_bits = _f32_to_fp8("e5m2")

    def _f32x2_to_fp8(kind: str):
        # The instruction keeps every non-NaN sign; OR-ing each input's sign in again only turns its
        # canonical NaN (0x7F) into the NaN with that sign, without a branch.
        text = (f"{{ .reg .b16 pair; .reg .b32 w, s1, s2; cvt.rn.satfinite.{kind}x2.f32 pair, $1, $2; "
                "cvt.u32.u16 w, pair; mov.b32 s1, $1; mov.b32 s2, $2; shr.b32 s1, s1, 16; "
                "and.b32 s1, s1, 0x8000; shr.b32 s2, s2, 24; and.b32 s2, s2, 0x80; "
                "or.b32 w, w, s1; or.b32 $0, w, s2; }")

        return _f32x2_word(text, swap=False)  # (hi, lo): hi is the first source

    f32x2_to_e4m3x2_bits = _f32x2_to_fp8("e4m3")
    f32x2_to_e5m2x2_bits = _f32x2_to_fp8("e5m2")

    _E4M3_TO_F32 = ("{ .reg .b16 byte, lo, hi; .reg .b32 halves; cvt.u16.u32 byte, $1; "
                    "cvt.rn.f16x2.e4m3x2 halves, byte; mov.b32 {lo, hi}, halves; cvt.f32.f16 $0, lo; }")

    @intrinsic
    def e4m3_bits_to_f32(typingctx, w):
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            low = builder.and_(builder.trunc(_to_i64(builder, args[0], w), _I32), ir.Constant(_I32, 0xFF))
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [_I32]), _E4M3_TO_F32, "=f,r")
            return builder.call(asm, [low])

        return types.float32(w), codegen
