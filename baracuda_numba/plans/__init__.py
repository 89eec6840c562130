"""Plans: one class per baracuda-kernels plan, with its Descriptor and Args."""

from .base import Plan, Verdict
from .per_tensor import *  # noqa: F403
from .per_tensor import __all__ as _per_tensor

__all__ = ["Plan", "Verdict", *_per_tensor]
