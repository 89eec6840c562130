"""Plans: one class per baracuda-kernels plan, with its Descriptor and Args."""

from .base import Plan, Verdict
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
from .tuning import DynamicTuning, ElementwiseTuning, MemoryTuning, PackedTuning

__all__ = ["Plan", "Verdict", *_per_tensor, *_per_axis, *_dynamic, *_linear, *_packed, *_fake, "MemoryTuning",
           "ElementwiseTuning", "DynamicTuning", "PackedTuning"]
