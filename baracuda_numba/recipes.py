"""Generated problems for the command line's ``demo`` and ``run``: for one op, its operands (host arrays), the
call (on host or device copies of them, into a preallocated output or not) and its NumPy reference.

The quantized element of a case (``q``) is what the op quantizes to (quantize, dynamic range), reads
(dequantize), simulates (fake quantize) or differentiates (the backward ops): int8 / uint8, FP8
(``fp8_e4m3``, ``fp8_e5m2``) or packed 4-bit (``s4``, ``u4``: the per-group family, fake quantize and
dynamic range, two values per byte). The references are those of :mod:`baracuda_numba.reference`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import InvalidProblem, problem_message
from .vocabulary import ElementKind, QuantizeKind

__all__ = ["RUNNABLE", "CLI_NAMES", "Case", "make_case", "check_problem", "linear_weight"]

# op -> (registry kind, family, role); role: what the op does with the quantized element.
_OPS: dict[str, tuple[QuantizeKind, str, str]] = {
    "quantize_per_tensor": (QuantizeKind.PER_TENSOR, "tensor", "quantize"),
    "dequantize_per_tensor": (QuantizeKind.DEQUANTIZE_PER_TENSOR, "tensor", "dequantize"),
    "fake_quantize": (QuantizeKind.FAKE_QUANTIZE, "tensor", "fake"),
    "quantize_per_tensor_backward": (QuantizeKind.PER_TENSOR_BACKWARD, "tensor", "quantize_backward"),
    "fake_quantize_backward": (QuantizeKind.FAKE_QUANTIZE_BACKWARD, "tensor", "fake_backward"),
    "dequantize_per_tensor_backward": (QuantizeKind.DEQUANTIZE_PER_TENSOR_BACKWARD, "tensor", "dequantize_backward"),
    **{f"{prefix}_per_{family}{suffix}": (QuantizeKind[f"{kind_prefix}PER_{family.upper()}{kind_suffix}"], family,
                                          f"{prefix}{suffix}")
       for family in ("channel", "token", "group")
       for prefix, kind_prefix in (("quantize", ""), ("dequantize", "DEQUANTIZE_"))
       for suffix, kind_suffix in (("", ""), ("_backward", "_BACKWARD"))},
    "dynamic_range_quantize": (QuantizeKind.DYNAMIC_RANGE, "dynamic", "quantize"),
    "quantized_linear": (QuantizeKind.QUANTIZED_LINEAR, "linear", "linear"),
    "smoothquant_linear": (QuantizeKind.QUANTIZED_LINEAR, "linear", "smoothquant"),
}
RUNNABLE = tuple(_OPS)
_PACKED = (ElementKind.S4, ElementKind.U4)
# The names the command line takes for each quantized element, in the order it lists them.
CLI_NAMES = {"s8": "int8", "u8": "uint8", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "s4": "int4",
             "u4": "uint4"}
_SCALE, _ZERO_POINT = 0.02, 3  # the per-tensor parameters; array scales span [0.01, 0.05]


@dataclass
class Case:
    """One generated problem. ``call(arrays, out)`` runs the op on ``arrays`` (``operands``' names, host or
    device) writing into ``out`` (None: a new result); ``expected()`` is the reference on the host arrays."""

    op: str
    label: str  # "f32->s8": the element read -> the element written
    operands: dict[str, np.ndarray]
    call: Callable[[dict[str, Any], Any], Any]
    expected: Callable[[], np.ndarray]
    out_shape: tuple[int, ...]
    out_dtype: np.dtype  # host dtype of the result (uint8 for packed 4-bit)
    exact: np.ndarray | None = field(default=None)  # unquantized float64 math, for the quantization error

    @property
    def bytes_moved(self) -> int:
        """Bytes the op must read and write, each once."""
        return sum(a.nbytes for a in self.operands.values()) + math.prod(self.out_shape) * self.out_dtype.itemsize


def _short(kind: ElementKind) -> str:
    return f"{kind.short} (packed)" if kind in _PACKED else kind.short


def linear_weight(k: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``[k, k]`` int8 weight and its per-output-channel scales (float32), always the same."""
    weight = np.random.default_rng(1).integers(-128, 128, (k, k)).astype(np.int8)
    return weight, np.linspace(0.001, 0.01, k).astype(np.float32)


def check_problem(op: str, kind: ElementKind, q: ElementKind, shape: tuple[int, ...], group_size: int | None,
                  where: str = "baracuda-numba run") -> int | None:
    """The group size ``op`` uses (None for an op without groups), after checking the arguments of a case;
    :class:`InvalidProblem` naming the option (``--dtype``, ``--out-dtype``, ``--shape``, ``--group-size``)
    and what is wrong with it."""
    from . import registry

    qkind, family, role = _OPS[op]
    if not kind.is_float or kind.is_fp8:
        raise InvalidProblem(problem_message(where, "--dtype", "a float dtype (float16, bfloat16, float32, float64)",
                                             kind.short))
    if family == "linear":
        if q is not ElementKind.S8:
            raise InvalidProblem(problem_message(where, "--out-dtype", f"int8 ({op} quantizes to int8)",
                                                 CLI_NAMES.get(q.short, q.short)))
    else:
        found = {e.output_element.short for e in registry.entries()
                 if e.kind is qkind and e.input_element is kind and e.output_element is not kind}
        if role in ("fake", "fake_backward"):  # an integer grid is simulated by the float kernel (f32->f32)
            found |= {"s8", "u8"}
        registered = [name for name in CLI_NAMES if name in found]
        if q.short not in registered:
            names = ", ".join(CLI_NAMES.get(name, name) for name in registered)
            raise InvalidProblem(problem_message(where, "--out-dtype", f"one of {names} for {op}",
                                                 CLI_NAMES.get(q.short, q.short)))
    if not shape or any(d < 1 for d in shape):
        raise InvalidProblem(problem_message(where, "--shape", "positive dimensions", " ".join(map(str, shape))))
    if family == "linear" and len(shape) != 2:
        raise InvalidProblem(problem_message(where, "--shape", f"two dimensions M K for {op}",
                                             " ".join(map(str, shape))))
    grouped = family == "group" or (q in _PACKED and role in ("quantize", "fake", "fake_backward")
                                    and family != "channel")
    if q in _PACKED and shape[-1] % 2:
        raise InvalidProblem(problem_message(where, "--shape", "an even last dimension (two 4-bit values per byte)",
                                             " ".join(map(str, shape))))
    if not grouped:
        if group_size is not None:
            raise InvalidProblem(problem_message(where, "--group-size", f"nothing ({op} has no groups)",
                                                 group_size))
        return None
    group_size = 32 if group_size is None else group_size
    if group_size < 1 or shape[-1] % group_size or (q in _PACKED and group_size % 2):
        even = " even" if q in _PACKED else ""
        raise InvalidProblem(problem_message(where, "--group-size", f"a positive{even} divisor of the last "
                                             f"dimension ({shape[-1]})", group_size))
    return group_size


def make_case(op: str, kind: ElementKind, q: ElementKind, shape: tuple[int, ...], group_size: int | None,
              rng: np.random.Generator) -> Case:
    """The problem ``op`` on ``shape`` with float element ``kind`` and quantized element ``q`` (arguments as
    checked by :func:`check_problem`)."""
    _, family, role = _OPS[op]
    if family == "linear":
        return _linear_case(op, kind, shape, rng)
    if family == "dynamic":
        return _dynamic_case(op, kind, q, shape, group_size, rng)
    if q in _PACKED and family == "tensor" and role in ("fake", "fake_backward"):
        family = "group"  # 4-bit fake quantize is per group (fake_quantize_per_group)
    return _elementwise_case(op, family, role, kind, q, shape, group_size, rng)


# Past this many elements a generated array repeats a random block of this size: the timed problems of a
# GPU demo (2^27 elements) are generated in a fraction of a second, and no kernel's speed depends on the values.
_RANDOM_BLOCK = 1 << 20


def _random(shape: tuple[int, ...], draw: Callable[[int], np.ndarray]) -> np.ndarray:
    size = math.prod(shape)
    return np.resize(draw(min(size, _RANDOM_BLOCK)), shape)


def _floats(rng: np.random.Generator, shape: tuple[int, ...], kind: ElementKind) -> np.ndarray:
    return _random(shape, lambda n: (rng.standard_normal(n, dtype=np.float32) * 1.5).astype(kind.numpy_dtype))


def _quantized(rng: np.random.Generator, shape: tuple[int, ...], q: ElementKind) -> np.ndarray:
    """Random values of ``q`` (packed bytes ``[..., D / 2]`` for 4-bit)."""
    if q in _PACKED:
        return _random((*shape[:-1], shape[-1] // 2), lambda n: rng.integers(0, 256, n).astype(np.uint8))
    if q.is_fp8:
        return _random(shape, lambda n: (rng.standard_normal(n, dtype=np.float32) * 8).astype(q.numpy_dtype))
    low, high = q.int_range
    return _random(shape, lambda n: rng.integers(low, high + 1, n).astype(q.numpy_dtype))


def _parameters(family: str, shape: tuple[int, ...], group_size: int | None,
                kind: ElementKind) -> tuple[Any, Callable[[], Any]]:
    """``(scales, a function giving the scales expanded to shape)``; float64 for f64 data, else float32."""
    from . import reference

    dtype = np.float64 if kind is ElementKind.F64 else np.float32
    if family == "tensor":
        return _SCALE, lambda: _SCALE
    rows = math.prod(shape[:-1])
    count = {"channel": shape[0], "token": rows, "group": rows * (shape[-1] // (group_size or 1))}[family]
    scales = np.linspace(0.01, 0.05, count).astype(dtype)
    expand = {"channel": lambda: reference.expand_channels(scales, shape, 0),
              "token": lambda: reference.expand_tokens(scales, shape),
              "group": lambda: reference.expand_groups(scales, shape, group_size)}[family]
    return scales, expand


def _references(q: ElementKind, kind: ElementKind) -> dict[str, Callable[..., np.ndarray]]:
    """The reference of each role for quantized element ``q``, each taking the op's data arrays, then the
    expanded scale and the zero point (0 for arrays)."""
    from . import reference
    from .reference import fp8, packed

    f = kind.numpy_dtype
    if q.is_fp8:
        e = q.numpy_dtype
        return {"quantize": lambda x, s, zp: fp8.fp8_quantize(x, s, e),
                "dequantize": lambda c, s, zp: fp8.fp8_dequantize(c, s, f),
                "quantize_backward": lambda dy, x, s, zp: fp8.fp8_quantize_backward(dy, x, s, e),
                "fake": lambda x, s, zp: fp8.fp8_fake_quantize(x, s, e),
                "fake_backward": lambda dy, x, s, zp: fp8.fp8_fake_quantize_backward(dy, x, s, e),
                "dequantize_backward": lambda dy, s, zp: reference.dequantize_backward(dy, s)}
    low, high = q.int_range
    signed = q is ElementKind.S4
    if q in _PACKED:
        quantize = lambda x, s, zp: packed.pack_nibbles(reference.quantize(x, s, zp, low, high, np.int8))  # noqa: E731
        dequantize = lambda c, s, zp: reference.dequantize(packed.unpack_nibbles(c, signed), s, zp, f)  # noqa: E731
    else:
        quantize = lambda x, s, zp: reference.quantize(x, s, zp, low, high, q.numpy_dtype)  # noqa: E731
        dequantize = lambda c, s, zp: reference.dequantize(c, s, zp, f)  # noqa: E731
    return {"quantize": quantize, "dequantize": dequantize,
            "quantize_backward": lambda dy, x, s, zp: reference.quantize_backward(dy, x, s, zp, low, high),
            "fake": lambda x, s, zp: reference.fake_quantize(x, s, zp, low, high),
            "fake_backward": lambda dy, x, s, zp: reference.fake_quantize_backward(dy, x, s, zp, low, high),
            "dequantize_backward": lambda dy, s, zp: reference.dequantize_backward(dy, s)}


# The data arrays each role reads, in the order the op takes them.
_DATA = {"quantize": ("x",), "dequantize": ("q",), "fake": ("x",), "quantize_backward": ("dy", "x"),
         "fake_backward": ("dy", "x"), "dequantize_backward": ("dy",)}


def _function(op: str, family: str, role: str, kind: ElementKind, q: ElementKind, zero_point: int | None,
              group_size: int | None) -> tuple[Callable[..., Any], Callable[[dict[str, Any]], tuple], dict]:
    """``(the dispatch function, the arguments after the data, its keywords)`` of one elementwise case."""
    from . import ops

    fn = getattr(ops, op)
    if role == "dequantize" and q in _PACKED:
        return ops.dequantize_per_group_packed, lambda a: (a["scales"], None, group_size), {"q_dtype": q,
                                                                                          "dtype": kind}
    if role in ("fake", "fake_backward") and family == "group":  # 4-bit fake quantize: per group
        fn = ops.fake_quantize_per_group_backward if role == "fake_backward" else ops.fake_quantize_per_group
    backward = role == "dequantize_backward"
    if family == "tensor":
        params = (lambda a: (_SCALE,)) if backward else (lambda a: (_SCALE, zero_point))
    else:
        tail = {"channel": (0,), "token": (), "group": (group_size,)}[family]
        params = (lambda a: (a["scales"], *tail)) if backward else (lambda a: (a["scales"], None, *tail))
    return fn, params, {"dtype": kind if role == "dequantize" else q}


def _elementwise_case(op, family, role, kind, q, shape, group_size, rng) -> Case:
    packed = q in _PACKED
    data = _DATA[role]
    draw = {"x": lambda: _floats(rng, shape, kind), "dy": lambda: _floats(rng, shape, kind),
            "q": lambda: _quantized(rng, shape, q)}
    source = {name: draw[name]() for name in data}  # only what the op reads: timed problems are large
    scales, expand = _parameters(family, shape, group_size, kind)
    zero_point = _ZERO_POINT if family == "tensor" and q.is_integer and q is not ElementKind.S4 else None
    operands = dict(source)
    if family != "tensor":
        operands["scales"] = scales
    fn, params, keywords = _function(op, family, role, kind, q, zero_point, group_size)
    reference = _references(q, kind)[role]

    def call(a: dict[str, Any], out: Any) -> Any:
        return fn(*(a[name] for name in data), *params(a), **keywords, out=out)

    def expected() -> np.ndarray:
        return reference(*(source[name] for name in data), expand(), zero_point or 0)

    if role == "quantize":
        label = f"{_short(kind)}->{_short(q)}"
        out_shape = (*shape[:-1], shape[-1] // 2) if packed else shape
        out_dtype = np.dtype(np.uint8) if packed else q.numpy_dtype
    else:
        label = f"{_short(q) if role == 'dequantize' else _short(kind)}->{_short(kind)}"
        out_shape, out_dtype = shape, kind.numpy_dtype
    exact = source["x"].astype(np.float64) if role == "fake" and source["x"].size <= _RANDOM_BLOCK else None
    return Case(op, label, operands, call, expected, tuple(out_shape), np.dtype(out_dtype), exact)


def _dynamic_case(op, kind, q, shape, group_size, rng) -> Case:
    from . import ops, reference
    from .reference import fp8, packed

    x = _floats(rng, shape, kind)
    if q in _PACKED:
        symmetric = q is ElementKind.S4
        low, high = q.int_range
        low = -high if symmetric else low

        def call(a, out):
            return ops.dynamic_range_quantize_packed(a["x"], group_size=group_size, dtype=q, out=out).q

        def expected():
            values = reference.dynamic.dynamic_range_quantize(x, "symmetric" if symmetric else "asymmetric", "group",
                                                              low, high, np.int8, group_size=group_size)[0]
            return packed.pack_nibbles(values)

        out_shape, out_dtype = (*shape[:-1], shape[-1] // 2), np.dtype(np.uint8)
    elif q.is_fp8:
        def call(a, out):
            return ops.dynamic_range_quantize(a["x"], dtype=q, out=out).q

        def expected():
            scale = fp8.fp8_dynamic_scale(x, q.numpy_dtype, "token").reshape(*shape[:-1], 1)
            return fp8.fp8_quantize(x, scale, q.numpy_dtype)

        out_shape, out_dtype = shape, q.numpy_dtype
    else:
        low, high = q.int_range

        def call(a, out):
            return ops.dynamic_range_quantize(a["x"], dtype=q, out=out).q

        def expected():
            return reference.dynamic.dynamic_range_quantize(x, "symmetric", "token", -high if low < 0 else 0, high,
                                                            q.numpy_dtype)[0]

        out_shape, out_dtype = shape, q.numpy_dtype
    return Case(op, f"{_short(kind)}->{_short(q)}", {"x": x}, call, expected, tuple(out_shape), np.dtype(out_dtype))


def _linear_case(op, kind, shape, rng) -> Case:
    """x ``[M, K]`` against a ``[K, K]`` int8 weight with per-output-channel scales."""
    from . import ops, reference

    m, k = shape
    weight, weight_scale = linear_weight(k)
    if op == "quantized_linear":
        x = _floats(rng, shape, kind)

        def call(a, out):
            return ops.quantized_linear(a["x"], a["weight"], a["weight_scale"], out=out)

        def expected():
            return reference.linear.quantized_linear(x, weight, weight_scale)

        exact = x.astype(np.float64) @ (weight.astype(np.float64) * weight_scale[:, None]).T
        operands, label = {"x": x}, f"{kind.short}->{kind.short}"
    else:
        act = _random(shape, lambda n: rng.integers(-127, 128, n).astype(np.int8))

        def call(a, out):
            return ops.smoothquant_linear(a["act"], a["weight"], a["weight_scale"], _SCALE, dtype=kind, out=out)

        def expected():
            return reference.linear.smoothquant_linear(act, weight, weight_scale, _SCALE, None, kind.numpy_dtype)

        exact, operands, label = None, {"act": act}, f"s8->{kind.short}"
    operands.update(weight=weight, weight_scale=weight_scale)
    return Case(op, label, operands, call, expected, (m, k), np.dtype(kind.numpy_dtype), exact)
