"""Checks of array scales and zero points, shared by every family that takes them (per channel, per token,
per group, packed 4-bit, and the W8A8 linear's ``weight_scale``).

A scale element must be finite and >= 0; where it is > 0 and the op multiplies by its reciprocal
(quantize, its backward, fake quantize), the reciprocal must be finite in the math precision (float32,
or float64 for float64 data), as for a per-tensor scale. An element scale of exactly 0 is defined
behaviour (its segment quantizes to ``clamp(zero_point)``, with zero gradient) and stays allowed. A
zero-point element must lie in ``[q_min, q_max]`` (PyTorch refuses one outside too). Anything else
raises :class:`~baracuda_numba.errors.InvalidProblem` naming the function, the argument, the first bad
index and its value.

Where the check runs (the ``validate=`` keyword of the dispatch functions):

- ``"host"`` (default): arrays whose bytes are on the host (NumPy, CPU torch tensors, everything under
  the simulator) are checked with NumPy before the launch, at no device cost; device arrays (CUDA torch
  tensors, CuPy, numba device arrays) are passed to the kernel unchecked, so a call costs no host sync.
- ``"device"``: device arrays are checked too, by one small reduction kernel
  (:mod:`baracuda_numba.kernels.checks`) on the call's stream, whose 16-byte answer is copied back:
  one host synchronization per call. Use it where the arrays change rarely (weights at load time), or
  call :func:`check_scales` / :func:`check_zero_points` once yourself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidProblem, problem_message

__all__ = ["VALIDATE", "check_validate", "check_scales", "check_zero_points", "check_operands", "first_bad_scale",
           "first_bad_zero_point"]

VALIDATE = ("host", "device")


def check_validate(validate: Any, where: str) -> str:
    """``validate`` itself: ``"host"`` or ``"device"``; else :class:`InvalidProblem`."""
    if validate not in VALIDATE:
        raise InvalidProblem(problem_message(where, "validate", "'host' or 'device'", repr(validate)))
    return validate


def _smallest_invertible(dtype: np.dtype) -> float:
    """The smallest positive value of ``dtype`` whose reciprocal is finite in ``dtype``."""
    one, s = dtype.type(1), dtype.type(1) / np.finfo(dtype).max  # within a few ulps of the answer
    with np.errstate(over="ignore", divide="ignore"):
        while not np.isfinite(one / s):
            s = np.nextafter(s, dtype.type(np.inf))
        while np.isfinite(one / np.nextafter(s, dtype.type(0))):
            s = np.nextafter(s, dtype.type(0))
    return float(s)


_SMALLEST = {np.dtype(np.float32): _smallest_invertible(np.dtype(np.float32)),
             np.dtype(np.float64): _smallest_invertible(np.dtype(np.float64))}


def _math_dtype(values: np.ndarray) -> np.dtype:
    return np.dtype(np.float64) if values.dtype == np.float64 else np.dtype(np.float32)


def first_bad_scale(values: Any, reciprocal: bool = True) -> int | None:
    """Flat index of the first element of host array ``values`` that is not a valid scale (see the module
    docstring), or None."""
    v = np.asarray(values)
    flat = v.reshape(-1)
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(flat) & (flat >= 0))
        if reciprocal and flat.size:
            bad |= (flat > 0) & (flat < _SMALLEST[_math_dtype(flat)])
    index = np.flatnonzero(bad)
    return int(index[0]) if index.size else None


def first_bad_zero_point(values: Any, q_min: int, q_max: int) -> int | None:
    """Flat index of the first element of host array ``values`` outside ``[q_min, q_max]``, or None."""
    flat = np.asarray(values).reshape(-1)
    index = np.flatnonzero((flat < q_min) | (flat > q_max))
    return int(index[0]) if index.size else None


def _at(shape: tuple[int, ...], flat: int) -> str:
    """``flat`` as the index a user would write for an array of ``shape``."""
    if len(shape) <= 1:
        return str(flat)
    return str(tuple(int(i) for i in np.unravel_index(flat, shape)))


def _scale_expected(reciprocal: bool, dtype: np.dtype) -> str:
    inverse = f" with a finite {_math_dtype(np.empty(0, dtype)).name} reciprocal where > 0" if reciprocal else ""
    return f"finite values >= 0{inverse}"


def check_scales(values: Any, argument: str, where: str, reciprocal: bool = True) -> None:
    """:class:`InvalidProblem` naming ``where``, ``argument``, the first bad index and its value unless every
    element of host array ``values`` is a valid scale: finite, >= 0 and, when ``reciprocal`` (the op
    multiplies by ``1/scale``) and > 0, with a finite reciprocal in the math precision."""
    values = np.asarray(values)
    index = first_bad_scale(values, reciprocal)
    if index is not None:
        value = values.reshape(-1)[index]
        raise InvalidProblem(problem_message(where, argument, _scale_expected(reciprocal, values.dtype),
                                             f"{value!s} at index {_at(values.shape, index)}"))


def check_zero_points(values: Any, argument: str, where: str, q_min: int, q_max: int) -> None:
    """:class:`InvalidProblem` naming ``where``, ``argument``, the first bad index and its value unless every
    element of host array ``values`` lies in ``[q_min, q_max]``."""
    values = np.asarray(values)
    index = first_bad_zero_point(values, q_min, q_max)
    if index is not None:
        value = values.reshape(-1)[index]
        raise InvalidProblem(problem_message(where, argument, f"integers in [{q_min}, {q_max}]",
                                             f"{int(value)} at index {_at(values.shape, index)}"))


def check_operands(scale: Any, zero_point: Any, where: str, validate: str, reciprocal: bool,
                   q_range: tuple[int, int] | None, names: tuple[str, str] = ("scales", "zero_points"),
                   stream: Any = None) -> None:
    """Check adapted scale (and zero-point, when not None) operands as ``validate`` says (module docstring):
    host bytes with NumPy; device bytes with the reduction kernel when ``validate == "device"``. Indices are
    reported in the operands' shapes; ``q_range`` None skips the zero points."""
    zero_point = zero_point if q_range is not None else None
    if scale.host is not None:
        check_scales(scale.host.reshape(scale.shape), names[0], where, reciprocal)
    if zero_point is not None and zero_point.host is not None:
        check_zero_points(zero_point.host.reshape(zero_point.shape), names[1], where, *q_range)
    scale_values = scale.obj if scale.host is None else None
    zp_values = zero_point.obj if zero_point is not None and zero_point.host is None else None
    if validate != "device" or (scale_values is None and zp_values is None):
        return
    from ..kernels.checks import first_bad_on_device

    limit = _SMALLEST[np.dtype(scale.element.numpy_dtype)] if reciprocal else 0.0
    low, high = q_range if q_range is not None else (0, 0)
    bad_scale, bad_zp = first_bad_on_device(scale_values, limit, zp_values, low, high, _stream(stream, scale))
    if bad_scale is not None:
        raise InvalidProblem(problem_message(where, names[0], _scale_expected(reciprocal, scale.element.numpy_dtype),
                                             f"{bad_scale[1]!s} at index {_at(scale.shape, bad_scale[0])}"))
    if bad_zp is not None:
        raise InvalidProblem(problem_message(where, names[1], f"integers in [{low}, {high}]",
                                             f"{int(bad_zp[1])} at index {_at(zero_point.shape, bad_zp[0])}"))


def _stream(stream: Any, like: Any) -> int:
    """The raw stream handle the op launches on, for the check to run in order with it."""
    from ..launch import stream_handle

    return stream_handle(stream, (like,), "validate")
