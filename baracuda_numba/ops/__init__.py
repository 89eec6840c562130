"""Dispatch functions: every op as one call on numba, torch, CuPy or NumPy arrays."""

from .common import clear_plan_cache
from .dynamic import *  # noqa: F403
from .dynamic import __all__ as _dynamic
from .fake import *  # noqa: F403
from .fake import __all__ as _fake
from .linear import *  # noqa: F403
from .linear import __all__ as _linear
from .packed import *  # noqa: F403
from .packed import __all__ as _packed
from .per_axis import *  # noqa: F403
from .per_axis import __all__ as _per_axis
from .per_tensor import *  # noqa: F403
from .per_tensor import __all__ as _per_tensor

__all__ = ["clear_plan_cache", *_per_tensor, *_per_axis, *_dynamic, *_linear, *_packed, *_fake]
