"""The per-stream workspaces of eager calls (:mod:`baracuda_numba.workspace`) on a memory stand-in: one buffer per
(device, stream) shared by every plan, grown to a power of two, an old buffer freed only after its stream (or its
device) is synchronised, since queued kernels may still read it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from baracuda_numba.workspace import MIN_WORKSPACE_BYTES, DeviceMemory, StreamWorkspaces


class Memory:
    """Allocations at distinct addresses, and the events in order."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.live: dict[int, tuple[int, int]] = {}  # pointer -> (device, bytes)
        self._next = 0x7F00_0000_0000  # an address no parameter happens to equal

    def allocate(self, device: int, nbytes: int) -> int:
        pointer, self._next = self._next, self._next + nbytes + 4096
        self.live[pointer] = (device, nbytes)
        self.events.append(("allocate", device, pointer, nbytes))
        return pointer

    def free(self, device: int, pointer: int) -> None:
        assert self.live.pop(pointer)[0] == device
        self.events.append(("free", device, pointer))

    def memory(self) -> DeviceMemory:
        return DeviceMemory(self.allocate, self.free, lambda d, s: self.events.append(("sync stream", d, s)),
                            lambda d: self.events.append(("sync device", d)))


def test_one_buffer_per_stream_shared_and_grown_after_a_stream_sync():
    memory = Memory()
    workspaces = StreamWorkspaces(memory.memory())
    a = workspaces.pointer(0, 0x77, 100)
    assert memory.events == [("allocate", 0, a, MIN_WORKSPACE_BYTES)]
    assert workspaces.pointer(0, 0x77, MIN_WORKSPACE_BYTES) == a  # another plan on the stream: the same bytes
    b = workspaces.pointer(0, 0x88, 10)  # another stream: its own
    c = workspaces.pointer(1, 0x77, 10)  # the same handle on another device
    assert len({a, b, c}) == 3
    memory.events.clear()
    grown = workspaces.pointer(0, 0x77, 3 * MIN_WORKSPACE_BYTES)
    assert memory.events == [("sync stream", 0, 0x77), ("free", 0, a), ("allocate", 0, grown, 4 * MIN_WORKSPACE_BYTES)]
    assert workspaces.held() == {(0, 0x77): 4 * MIN_WORKSPACE_BYTES, (0, 0x88): MIN_WORKSPACE_BYTES,
                                 (1, 0x77): MIN_WORKSPACE_BYTES}
    memory.events.clear()
    workspaces.release()
    assert memory.events[:2] == [("sync device", 0), ("sync device", 1)]
    assert sorted(e[2] for e in memory.events[2:]) == sorted([grown, b, c]) and not memory.live
    assert workspaces.held() == {}


def test_a_stream_past_the_limit_releases_the_oldest_after_a_device_sync():
    memory = Memory()
    workspaces = StreamWorkspaces(memory.memory(), streams_per_device=2)
    first = workspaces.pointer(0, 1, 10)
    workspaces.pointer(0, 2, 10)
    workspaces.pointer(1, 3, 10)  # another device does not count
    memory.events.clear()
    third = workspaces.pointer(0, 4, 10)
    assert memory.events == [("sync device", 0), ("free", 0, first), ("allocate", 0, third, MIN_WORKSPACE_BYTES)]
    assert set(workspaces.held()) == {(0, 2), (0, 4), (1, 3)}


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 5), st.integers(0, 1 << 22)), max_size=40),
       st.integers(1, 4))
def test_every_buffer_fits_its_call_and_none_is_freed_unsynchronised(requests, limit):
    memory = Memory()
    workspaces = StreamWorkspaces(memory.memory(), streams_per_device=limit)
    for device, stream, nbytes in requests:
        before = len(memory.events)
        pointer = workspaces.pointer(device, stream, nbytes)
        live_device, size = memory.live[pointer]
        assert live_device == device and size >= max(nbytes, MIN_WORKSPACE_BYTES) and size & (size - 1) == 0
        new = memory.events[before:]
        for i, event in enumerate(new):  # each free follows a sync of its stream or of its whole device
            if event[0] == "free":
                assert any(e in (("sync device", device), ("sync stream", device, stream)) for e in new[:i])
        assert sum(1 for d, _ in workspaces.held() if d == device) <= limit
    assert set(memory.live) == {p for p, _ in workspaces._buffers.values()}
