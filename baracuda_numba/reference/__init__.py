"""Independent NumPy implementations of the semantics (the README's "Semantics" section), used by tests
and notebooks."""

from . import dynamic, fp8, linear, packed
from .dynamic import dynamic_range_params, segments_view
from .elementwise import *  # noqa: F403
from .elementwise import __all__ as _elementwise

__all__ = ["dynamic", "fp8", "linear", "packed", "dynamic_range_params", "segments_view", *_elementwise]
