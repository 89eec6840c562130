"""Vocabulary and errors: values, normalisation, hashability, error classes."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import baracuda_numba as bn
from baracuda_numba import ElementKind as E
from baracuda_numba import QuantizeKind as K


def test_quantize_kind_values_match_the_rust_enum():
    expected = {
        "PER_TENSOR": 0, "PER_TENSOR_BACKWARD": 1, "DEQUANTIZE_PER_TENSOR": 2,
        "DEQUANTIZE_PER_TENSOR_BACKWARD": 3, "PER_CHANNEL": 4, "PER_CHANNEL_BACKWARD": 5,
        "DEQUANTIZE_PER_CHANNEL": 6, "DEQUANTIZE_PER_CHANNEL_BACKWARD": 7, "FAKE_QUANTIZE": 8,
        "FAKE_QUANTIZE_BACKWARD": 9, "PER_TOKEN": 16, "PER_TOKEN_BACKWARD": 17, "PER_GROUP": 18,
        "PER_GROUP_BACKWARD": 19, "DYNAMIC_RANGE": 20, "DEQUANTIZE_PER_TOKEN": 21,
        "DEQUANTIZE_PER_TOKEN_BACKWARD": 22, "DEQUANTIZE_PER_GROUP": 23, "DEQUANTIZE_PER_GROUP_BACKWARD": 24,
        "QUANTIZED_LINEAR": 25,
    }
    assert {k.name: int(k) for k in K} == expected


@pytest.mark.parametrize(("value", "kind"), [
    ("int8", E.S8), ("uint8", E.U8), ("float16", E.F16), ("bfloat16", E.BF16), ("float32", E.F32),
    ("float64", E.F64), ("f32", E.F32), ("bf16", E.BF16), ("s8", E.S8), ("BF16", E.BF16),
    (np.float32, E.F32), (np.dtype(np.int8), E.S8), (ml_dtypes.bfloat16, E.BF16), (E.U8, E.U8),
    (np.dtype("float16"), E.F16), ("int32", E.I32),
])
def test_element_kind_normalises_every_spelling(value, kind):
    assert bn.element_kind(value) is kind


def test_element_kind_accepts_torch_and_numba_dtypes():
    from numba import types

    assert bn.element_kind(types.float32) is E.F32
    assert bn.element_kind(types.int8) is E.S8
    torch = pytest.importorskip("torch")
    assert bn.element_kind(torch.bfloat16) is E.BF16
    assert bn.element_kind(torch.quint8) is E.U8


@pytest.mark.parametrize("bad", ["int7", np.int16, object(), np.complex64])
def test_element_kind_rejects_unknown_dtypes(bad):
    with pytest.raises(TypeError, match="dtype expected"):
        bn.element_kind(bad)


def test_element_properties():
    assert E.S8.int_range == (-128, 127) and E.U8.int_range == (0, 255)
    assert E.BF16.storage_dtype == np.uint16 and E.BF16.numpy_dtype == ml_dtypes.bfloat16
    assert E.F64.math_precision is bn.MathPrecision.F64 and E.F16.math_precision is bn.MathPrecision.F32
    assert [e.itemsize for e in (E.F16, E.BF16, E.F32, E.F64, E.S8, E.U8)] == [2, 2, 4, 8, 1, 1]
    with pytest.raises(ValueError):
        _ = E.F32.int_range


def test_sku_and_guarantee_are_frozen_and_hashable():
    sku = bn.registry.entries()[0].sku
    assert {sku: 1}[sku] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        sku.arch = bn.ArchSku.SM90A
    assert str(sku).startswith("quantization/per_tensor/f32->s8")
    pref = bn.PlanPreference()
    assert pref.max_workspace_bytes is None and pref.allow_sm90a and hash(pref) == hash(bn.PlanPreference())


def test_error_hierarchy():
    assert issubclass(bn.Unsupported, NotImplementedError) and issubclass(bn.Unsupported, bn.BaracudaError)
    assert issubclass(bn.InvalidProblem, ValueError) and issubclass(bn.InvalidProblem, bn.BaracudaError)
    assert issubclass(bn.MisalignedOperand, bn.InvalidProblem)
    assert issubclass(bn.InvalidOperand, TypeError)
    error = bn.WorkspaceTooSmall("SomePlan", 128, 64)
    assert (error.needed, error.got) == (128, 64)
    assert str(error) == "SomePlan: workspace expected >= 128 bytes, got 64 bytes"
