"""When does a programmatic dependent kernel start, and when does its ``griddepcontrol.wait`` return?

Every block of a stand-in for the decode GEMM (``stamp``: 256 blocks of 256 threads, launched through
the package's launcher as a programmatic dependent) reads ``%globaltimer`` when it starts and again
after ``griddepcontrol.wait``. Before it on the stream runs either ``spin`` (one block that calls
``griddepcontrol.launch_dependents`` first, then spins for a set time, stamping its own start and end)
or the package's per-token quantizer (``dynamic_range_quantize`` of one bf16 row of K) after a spin of
0 ns, whose end marks the quantizer's launch. Printed, in microseconds from the spin's start:
the dependent blocks' first / median / last start and their wait's return; eager launches and CUDA
graph replays.

    python3 -m benchmarks.probe_pdl"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

import baracuda_numba as bn
from baracuda_numba.kernels import device
from baracuda_numba.launch import ArrayArg, KernelLauncher

BLOCKS, THREADS = 256, 256


@intrinsic
def global_timer(typingctx):
    """``%globaltimer``: nanoseconds, the same clock on every SM."""

    def codegen(context, builder, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), []), "mov.u64 $0, %globaltimer;", "=l", side_effect=True)
        return builder.call(asm, [])

    return types.uint64(), codegen


@cuda.jit("void(uint64[::1], int64)")
def spin(times, nanoseconds):
    device.launch_dependents()
    start = global_timer()
    while global_timer() - start < nanoseconds:
        pass
    if cuda.threadIdx.x == 0:
        times[0] = start
        times[1] = global_timer()


@cuda.jit("void(uint64[::1], int64)")
def stamp(times, unused):
    start = global_timer()
    device.grid_dependency_wait()
    released = global_timer()
    if cuda.threadIdx.x == 0:
        times[2 + 2 * cuda.blockIdx.x] = start
        times[3 + 2 * cuda.blockIdx.x] = released


def summary(times: np.ndarray, origin: int) -> str:
    starts = (times[2::2].astype(np.int64) - origin) / 1e3
    released = (times[3::2].astype(np.int64) - origin) / 1e3
    return (f"dependent starts {starts.min():6.2f} / {np.median(starts):6.2f} / {starts.max():6.2f}  "
            f"wait returns {released.min():6.2f} / {np.median(released):6.2f} / {released.max():6.2f} us")


def main() -> None:
    times = torch.zeros(2 + 2 * BLOCKS, dtype=torch.int64, device="cuda")
    arg = ArrayArg(times.data_ptr(), times.numel(), 8)
    spinner = KernelLauncher(lambda: spin, 1, (np.int64,))
    dependent = KernelLauncher(lambda: stamp, 1, (np.int64,), dependent=True)
    plain = KernelLauncher(lambda: stamp, 1, (np.int64,))

    def stream() -> int:
        return torch.cuda.current_stream().cuda_stream

    def with_spin(ns: int, launcher: KernelLauncher):
        def run():
            spinner.launch(1, 32, stream(), [arg], [ns])
            launcher.launch(BLOCKS, THREADS, stream(), [arg], [0])
        return run

    def with_quantizer(k: int, launcher: KernelLauncher):
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)

        def run():
            spinner.launch(1, 32, stream(), [arg], [0])  # stamps (nearly) when the quantizer is launched
            bn.dynamic_range_quantize(x)
            launcher.launch(BLOCKS, THREADS, stream(), [arg], [0])
        return run

    cases = [(f"spin {ns} ns, {name}", with_spin(ns, launcher), True)
             for ns in (2000, 5000) for name, launcher in (("dependent", dependent), ("plain", plain))]
    cases += [(f"quantizer K={k}, {name}", with_quantizer(k, launcher), True)
              for k in (4096, 11008) for name, launcher in (("dependent", dependent), ("plain", plain))]
    for label, run, primary_stamps in cases:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times.zero_()
        run()
        torch.cuda.synchronize()
        t = times.cpu().numpy().astype(np.uint64)
        origin = int(t[0]) if primary_stamps else int(t[2::2].min())
        extra = f"  primary ends {(int(t[1]) - origin) / 1e3:6.2f}" if primary_stamps else ""
        print(f"eager  {label:34s} {summary(t, origin)}{extra}")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(4):
                run()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        times.zero_()
        graph.replay()
        torch.cuda.synchronize()
        t = times.cpu().numpy().astype(np.uint64)  # the last of the four calls in the graph
        origin = int(t[0]) if primary_stamps else int(t[2::2].min())
        extra = f"  primary ends {(int(t[1]) - origin) / 1e3:6.2f}" if primary_stamps else ""
        print(f"graph  {label:34s} {summary(t, origin)}{extra}")


if __name__ == "__main__":
    main()
