"""Typed errors. Every message reads ``"{plan}: {argument} expected {expected}, got {given}"``."""

from __future__ import annotations

__all__ = [
    "BaracudaError",
    "Unsupported",
    "InvalidProblem",
    "InvalidOperand",
    "MisalignedOperand",
    "WorkspaceTooSmall",
    "DeviceUnavailable",
    "problem_message",
]


def problem_message(plan: str, argument: str, expected: object, given: object) -> str:
    """The one message format of the package."""
    return f"{plan}: {argument} expected {expected}, got {given}"


class BaracudaError(Exception):
    """Base class of every error raised by baracuda-numba."""


class Unsupported(BaracudaError, NotImplementedError):
    """The registry holds no kernel for this combination (dtype pair, kind)."""


class InvalidProblem(BaracudaError, ValueError):
    """The problem or its arrays are wrong (shape, range, scale, layout...)."""


class InvalidOperand(BaracudaError, TypeError):
    """An argument is not an array this package can read (no known protocol)."""


class MisalignedOperand(InvalidProblem):
    """An operand's address does not meet the alignment a kernel needs."""


class WorkspaceTooSmall(InvalidProblem):
    """The workspace given to ``run`` is smaller than ``workspace_size()``."""

    def __init__(self, plan: str, needed: int, got: int) -> None:
        self.needed = needed
        self.got = got
        super().__init__(problem_message(plan, "workspace", f">= {needed} bytes", f"{got} bytes"))


class DeviceUnavailable(BaracudaError, RuntimeError):
    """No GPU to run on, and the simulator fallback is forbidden (``NUMBA_ENABLE_CUDASIM=0``)."""
