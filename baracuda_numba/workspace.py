"""Device memory the plans keep between eager calls: one workspace per (device, stream), from the driver.

A plan whose call needs scratch memory (the W8A8 linear's quantized activations and row scales) takes it,
on an eager call without a given workspace, from :func:`stream_workspaces`: one buffer per (device, stream)
that every plan launching on that stream shares (launches on one stream run in order, so each call may reuse
the bytes the call before it used; ``docs/design-linear.md``, "The launch path").

The buffers come from the driver (``cuMemAlloc``), never from PyTorch's caching allocator. That is what
makes them safe under CUDA graphs: ``torch.compile(mode="reduce-overhead")`` runs its warm-up calls with
every allocation of the thread routed into the graph's private memory pool, and refuses a pool holding a
block that is not one of the graph's outputs ("Detected N tensor(s) in the cudagraph pool not tracked as
outputs"); a buffer kept from torch's allocator past such a call is that block. A call being captured into
a graph does not use these buffers at all: it takes bytes of the graph's own pool, freed when the call
returns, which the graph keeps for its replays (a graph may replay on another stream next to eager calls
on this one). ``tests/test_linear_fast.py`` checks both.

A buffer grows (to the next power of two) when a larger workspace is asked: the old one is freed after its
stream is synchronised, since queued kernels may still read it. Memory from here is not counted by
``torch.cuda.memory_allocated``; :meth:`StreamWorkspaces.release` frees it all.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DeviceMemory", "StreamWorkspaces", "stream_workspaces", "MIN_WORKSPACE_BYTES"]

MIN_WORKSPACE_BYTES = 1 << 16  # the smallest buffer allocated: decode workspaces of every Llama shape fit
_STREAMS_PER_DEVICE = 16  # buffers kept per device; a new stream past them releases the oldest


@dataclass(frozen=True)
class DeviceMemory:
    """How :class:`StreamWorkspaces` gets device memory: ``allocate(device, nbytes) -> pointer`` (zeroed),
    ``free(device, pointer)``, ``synchronize_stream(device, stream)`` and ``synchronize_device(device)``
    (the driver's in :func:`stream_workspaces`; tests pass their own)."""

    allocate: Callable[[int, int], int]
    free: Callable[[int, int], None]
    synchronize_stream: Callable[[int, int], None]
    synchronize_device: Callable[[int], None]


class StreamWorkspaces:
    """Workspace buffers of at least the bytes asked, one per (device, stream), kept until :meth:`release`.

    :meth:`pointer` is on every eager call that needs scratch memory: a dict lookup and a size comparison
    once the stream's buffer is large enough."""

    def __init__(self, memory: DeviceMemory, streams_per_device: int = _STREAMS_PER_DEVICE) -> None:
        self._memory = memory
        self._limit = streams_per_device
        self._buffers: dict[tuple[int, int], tuple[int, int]] = {}  # (device, stream) -> (pointer, bytes)
        self._lock = threading.Lock()

    def pointer(self, device: int, stream: int, nbytes: int) -> int:
        """The address of ``stream``'s buffer on ``device``, of at least ``nbytes`` bytes."""
        found = self._buffers.get((device, stream))
        if found is not None and found[1] >= nbytes:
            return found[0]
        return self._grow(device, stream, nbytes)

    def _grow(self, device: int, stream: int, nbytes: int) -> int:
        memory = self._memory
        with self._lock:
            key = (device, stream)
            found = self._buffers.get(key)
            if found is not None:
                if found[1] >= nbytes:
                    return found[0]
                memory.synchronize_stream(device, stream)  # queued kernels may still read the old buffer
                memory.free(device, found[0])
                del self._buffers[key]
            else:
                same_device = [k for k in self._buffers if k[0] == device]
                if len(same_device) >= self._limit:  # the oldest stream's buffer (its stream may be gone)
                    oldest = same_device[0]
                    memory.synchronize_device(device)
                    memory.free(device, self._buffers.pop(oldest)[0])
            size = max(MIN_WORKSPACE_BYTES, 1 << max(nbytes - 1, 0).bit_length())
            pointer = memory.allocate(device, size)
            self._buffers[key] = (pointer, size)
            return pointer

    def held(self) -> dict[tuple[int, int], int]:
        """``{(device, stream): bytes}`` of every buffer held."""
        return {key: size for key, (_, size) in self._buffers.items()}

    def release(self) -> None:
        """Free every buffer, after each device's queued work (a later call allocates again)."""
        with self._lock:
            for device in sorted({device for device, _ in self._buffers}):
                self._memory.synchronize_device(device)
            for (device, _), (pointer, _) in self._buffers.items():
                self._memory.free(device, pointer)
            self._buffers.clear()


@functools.cache
def stream_workspaces() -> StreamWorkspaces:
    """The process's workspaces, on the driver's memory (GPU only)."""
    from .launch import driver_memory

    return StreamWorkspaces(driver_memory())
