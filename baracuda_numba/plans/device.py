"""What the plans read of a device, and which card's tuning values it takes.

:func:`device_properties` reads the compute capability, the multiprocessor count and the DRAM bandwidth
(``2 x memory clock x bus width``: the driver's attributes, not a measurement) once per device. :func:`card_of`
names the card whose tuning values a device takes, by a pure rule on those properties, never on the card's name:
``"h200"`` for a compute capability 9.0 device with at least :data:`H200_MIN_BANDWIDTH` of DRAM bandwidth (as many
SMs as an H100 and about 1.4x its bandwidth: kernels need more bytes in flight per SM there), else ``"h100"``, the
card every value was first measured on. The W8A8 family's tuning (:mod:`.linear.tuning`) and the memory-bound
families' (:mod:`.tuning`) both choose by it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..platform import SIMULATOR

__all__ = ["DeviceProperties", "H100_SXM", "H200_SXM", "SIMULATED", "H200_MIN_BANDWIDTH", "card_of",
           "device_properties"]


@dataclass(frozen=True)
class DeviceProperties:
    """What the tuning choice reads of a device: its compute capability, its multiprocessor count, its DRAM
    bandwidth in bytes per second (``2 x memory clock x bus width``: the driver's attributes, not a
    measurement), and whether it runs sm_90a code (a compute capability 9.0 GPU; never the simulator, which
    has no warpgroup)."""

    compute_capability: tuple[int, int]
    multiprocessors: int
    memory_bandwidth: float
    sm90a: bool


# The cards the tuning values are named after (an H100 SXM: 2619 MHz x 5120 bits; an H200: 3201 MHz x 6144).
H100_SXM = DeviceProperties((9, 0), 132, 2 * 2619e6 * 5120 / 8, True)
H200_SXM = DeviceProperties((9, 0), 132, 2 * 3201e6 * 6144 / 8, True)
# What the simulator reports: an H100's shape (so that tests choose what an H100 runs), without sm_90a.
SIMULATED = DeviceProperties((9, 0), 132, H100_SXM.memory_bandwidth, False)
# From this DRAM bandwidth a compute capability 9.0 card is H200-class (an H100 SXM has 3.35 TB/s, an H200 4.9).
H200_MIN_BANDWIDTH = 4.0e12


def card_of(device: DeviceProperties) -> str:
    """The card whose tuning values ``device`` takes: ``"h200"`` for a compute capability 9.0 device with at
    least :data:`H200_MIN_BANDWIDTH` of DRAM bandwidth, else ``"h100"``."""
    if device.compute_capability == (9, 0) and device.memory_bandwidth >= H200_MIN_BANDWIDTH:
        return "h200"
    return "h100"


def device_properties(device_id: int | None = None) -> DeviceProperties:
    """The properties of CUDA device ``device_id`` (None: the current device), read once per device from the
    driver; :data:`SIMULATED` under the simulator."""
    if SIMULATOR:
        return SIMULATED
    if device_id is None:
        from numba import cuda

        device_id = cuda.get_current_device().id
    return _device_properties(device_id)


@functools.cache
def _device_properties(device_id: int) -> DeviceProperties:
    from numba import cuda

    gpu = cuda.gpus[device_id]
    major, minor = tuple(gpu.compute_capability)
    try:
        bandwidth = 2 * gpu.MEMORY_CLOCK_RATE * 1e3 * gpu.GLOBAL_MEMORY_BUS_WIDTH / 8  # kHz, bits
    except Exception:  # a driver that does not report them: no bandwidth, so the H100's values
        bandwidth = 0.0
    return DeviceProperties((major, minor), gpu.MULTIPROCESSOR_COUNT, bandwidth, (major, minor) == (9, 0))
