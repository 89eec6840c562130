"""Independent NumPy implementations of the semantics (SPEC section 5), used by tests and notebooks."""

from .elementwise import *  # noqa: F403
from .elementwise import __all__ as _elementwise

__all__ = [*_elementwise]
