"""The int8 GEMM kernels of the W8A8 linear layers, on tensor cores (``docs/design-linear.md``).

One module per kernel kind, each a factory that takes one frozen configuration and is cached on it (the
kernel's name comes from the configuration):

- :mod:`.common`: the operand loaders, the ``mma.sync`` step and the one epilogue every kernel shares.
- :mod:`.tiled`: register-staged tiles, any alignment and any ``K`` (:class:`TiledConfig`).
- :mod:`.pipelined`: ``cp.async`` stages and ``ldmatrix`` (:class:`PipelinedConfig`).
- :mod:`.warpgroup`: Hopper's ``wgmma`` from a swizzled ring, sm_90a (:class:`WarpgroupConfig`), loaded by
  :mod:`.sm90a`.
- :mod:`.skinny`: the decode GEMM streaming the weight once (:class:`SkinnyConfig`), on the weight stream of
  :mod:`.decode`.
- :mod:`.fused`: the decode GEMM that quantizes ``x`` per token itself (:class:`FusedConfig`).
- :mod:`.static_quantizer`: ``x`` quantized with one static scale for the GEMM (:class:`StaticQuantizerConfig`).

Which configuration runs for a problem is the plans' choice (:mod:`baracuda_numba.plans.linear`).
"""

from __future__ import annotations

from typing import Any

from .common import (
    ABSMAX_LOADS,
    CHUNK_K,
    MAX_EXACT_K,
    SKINNY_M,
    SKINNY_MAX_M,
    SKINNY_N,
    SKINNY_THREADS,
    SKINNY_WARPS,
    Output,
)
from .fused import FusedConfig, fused_kernel, fused_shared_bytes
from .pipelined import PipelinedConfig, PipelineShape, pipelined_kernel
from .skinny import SkinnyConfig, skinny_kernel
from .sm90a import HopperKernel, hopper_available
from .static_quantizer import StaticQuantizerConfig, static_quantizer_kernel
from .tiled import TILE_M, TILE_N, TILE_THREADS, TiledConfig, tiled_kernel
from .warpgroup import EPILOGUE_PAD, SLOT_ALIGNMENT, WarpgroupConfig, WgmmaShape, warpgroup_kernel

__all__ = ["CHUNK_K", "MAX_EXACT_K", "SKINNY_M", "SKINNY_MAX_M", "SKINNY_N", "SKINNY_THREADS", "SKINNY_WARPS",
           "TILE_M", "TILE_N", "TILE_THREADS", "ABSMAX_LOADS", "EPILOGUE_PAD", "SLOT_ALIGNMENT", "Output",
           "TiledConfig", "PipelineShape", "PipelinedConfig", "WgmmaShape", "WarpgroupConfig", "SkinnyConfig",
           "FusedConfig", "StaticQuantizerConfig", "GemmConfig", "HopperKernel", "tiled_kernel", "pipelined_kernel",
           "warpgroup_kernel", "skinny_kernel", "fused_kernel", "static_quantizer_kernel", "gemm_kernel",
           "fused_shared_bytes", "hopper_available", "clear_kernel_caches"]

GemmConfig = TiledConfig | PipelinedConfig | WarpgroupConfig | SkinnyConfig | FusedConfig

_FACTORIES: dict[type, Any] = {TiledConfig: tiled_kernel, PipelinedConfig: pipelined_kernel,
                               WarpgroupConfig: warpgroup_kernel, SkinnyConfig: skinny_kernel,
                               FusedConfig: fused_kernel, StaticQuantizerConfig: static_quantizer_kernel}


def gemm_kernel(config: GemmConfig | StaticQuantizerConfig) -> Any:
    """The kernel of any configuration of the family (its kind's factory, cached on ``config``): an
    :class:`~baracuda_numba.kernels.elementwise.ElementwiseKernel`, or a :class:`HopperKernel` for the
    warpgroup kernel; both give a launcher its compiled form through ``compiled()``."""
    return _FACTORIES[type(config)](config)


def clear_kernel_caches() -> None:
    """Forget every built kernel of the family (each factory's cache)."""
    for factory in _FACTORIES.values():
        factory.cache_clear()
