"""Independent NumPy implementations of the semantics (the README's "Semantics" section), used by tests
and notebooks."""

from . import dynamic, linear
from .dynamic import dynamic_range_params, segments_view
from .elementwise import *  # noqa: F403
from .elementwise import __all__ as _elementwise

__all__ = ["dynamic", "linear", "dynamic_range_params", "segments_view", *_elementwise]
