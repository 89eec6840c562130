"""GPU benchmark of quantization-aware training's fake quantize: :class:`~baracuda_numba.torch.FakeQuantize`
against ``torch.ao.quantization.FakeQuantize`` on the same weight, forward + backward, and the fused
kernels against PyTorch's fake-quantize ops.

    baracuda-numba bench --only qat            (rows in bench.json / bench.md)
    python -m baracuda_numba.torch.benchmark_qat [--shape 4096 4096] [--dtypes bf16 f32]

Module rows: one QAT step of a weight ``w`` (``y = fq(w)``, ``y.backward(dy)``, the gradient reset), both
modules training with their observers on (and again with them off: the fake quantize alone), in the four
configurations QAT uses (torch.ao's default per-channel weight and per-tensor activation fake quantizers,
and the min-max ones). Timed on the GPU timeline: CUDA events around ``steps`` back-to-back steps, median
of ``repeats``, so the time per step is what a training loop sees, host gaps included (torch.ao reads
device values on the host several times a step; ours never does). The host time per step of ours is
timed apart, behind a GPU busy wait (:func:`baracuda_numba.bench.host_us`). Each row also says whether
the two modules gave the same output, gradient, scale and zero point bits.

Kernel rows: the fused forward (``fake_quantize_per_channel``) and backward (``..._backward``) against
``torch.fake_quantize_per_channel_affine`` forward and its autograd (forward + backward), GPU time
behind a busy wait, GB/s on the bytes each must move and % of the device-to-device copy of the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import baracuda_numba as bn

from .. import bench
from . import ops
from .modules import FakeQuantize

bench._import_torch()  # the shared timers read the benchmark module's torch, imported on demand there

__all__ = ["QatBenchConfig", "run", "markdown", "main"]

TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@dataclass(frozen=True)
class QatBenchConfig:
    """What :func:`run` measures: the weight's shape and dtypes, steps per timing, timings per row."""

    shape: tuple[int, int] = (4096, 4096)  # a Llama-7B attention projection
    dtypes: tuple[str, ...] = ("bf16",)
    steps: int = 20
    repeats: int = 5


@dataclass(frozen=True)
class _Case:
    label: str
    per_channel: bool
    symmetric: bool
    moving_average: bool
    q_min: int
    q_max: int

    def ours(self) -> FakeQuantize:
        return FakeQuantize(dtype=torch.int8 if self.q_min < 0 else torch.uint8,
                            granularity="per_channel" if self.per_channel else "per_tensor", ch_axis=0,
                            observer="moving_average" if self.moving_average else "minmax",
                            symmetric=self.symmetric, q_min=self.q_min, q_max=self.q_max)

    def theirs(self) -> torch.nn.Module:
        from torch.ao.quantization import FakeQuantize as TorchFakeQuantize
        from torch.ao.quantization import observer as obs

        observer = {(True, True): obs.MovingAveragePerChannelMinMaxObserver,
                    (True, False): obs.PerChannelMinMaxObserver, (False, True): obs.MovingAverageMinMaxObserver,
                    (False, False): obs.MinMaxObserver}[self.per_channel, self.moving_average]
        qscheme = {(True, True): torch.per_channel_symmetric, (True, False): torch.per_channel_affine,
                   (False, True): torch.per_tensor_symmetric, (False, False): torch.per_tensor_affine}[
            self.per_channel, self.symmetric]
        extra = {"ch_axis": 0} if self.per_channel else {}
        return TorchFakeQuantize(observer=observer, quant_min=self.q_min, quant_max=self.q_max,
                                 dtype=torch.qint8 if self.q_min < 0 else torch.quint8, qscheme=qscheme, **extra)


CASES = (
    _Case("per channel, symmetric int8, moving average (torch.ao's default weight fake quant)", True, True, True,
          -128, 127),
    _Case("per channel, symmetric int8 [-127, 127], min-max (FakeQuantLinear's weight)", True, True, False, -127,
          127),
    _Case("per tensor, affine uint8, moving average (torch.ao's default activation fake quant)", False, False, True,
          0, 255),
    _Case("per tensor, symmetric int8, min-max", False, True, False, -128, 127),
)


def step_ms(module: torch.nn.Module, w: torch.Tensor, dy: torch.Tensor, steps: int, repeats: int) -> float:
    """Median milliseconds per QAT step of ``module`` on ``w`` (forward, backward of ``dy``, gradient
    reset), CUDA events around ``steps`` back-to-back steps: host gaps count."""

    def step() -> None:
        module(w).backward(dy)
        w.grad = None

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / steps)
    return statistics.median(samples)


def _same_step(case: _Case, w: torch.Tensor, dy: torch.Tensor) -> bool:
    """Fresh modules, two steps each: the same output, gradient, scale and zero point bits."""
    ours, theirs = case.ours().to(w.device), case.theirs().to(w.device)
    for _ in range(2):
        wa, wb = w.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        ya, yb = ours(wa), theirs(wb)
        ya.backward(dy)
        yb.backward(dy)
        same = (torch.equal(ya, yb) and torch.equal(wa.grad, wb.grad) and torch.equal(ours.scale, theirs.scale.float())
                and torch.equal(ours.zero_point, theirs.zero_point.to(torch.int32)))
        if not same:
            return False
    return True


def _step(module: torch.nn.Module, w: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        module(w).backward(dy)
        w.grad = None

    return step


def module_rows(config: QatBenchConfig) -> list[dict]:
    """One row per dtype, case and observer switch (on, then off with the parameters of one observed step)."""
    rows = []
    for name in config.dtypes:
        g = torch.Generator(device="cuda").manual_seed(0)
        w = (torch.randn(config.shape, device="cuda", generator=g) * 0.02).to(TORCH[name]).requires_grad_()
        dy = torch.randn(config.shape, device="cuda", generator=g).to(TORCH[name])
        for case in CASES:
            for observing in (True, False):
                row = {"section": "qat module", "case": case.label, "observer": observing, "dtype": name,
                       "shape": list(config.shape)}
                try:
                    row.update(_module_timings(case, observing, w, dy, config))
                except Exception as exc:  # a row with the error, the other rows still measured
                    row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
                rows.append(row)
                print(f"qat {name} {'observing' if observing else 'frozen':<9} {case.label[:48]:<48} "
                      + (f"ours {row['ms']:.3f} ms (host {row['host_us']:.0f} us)  torch.ao {row['torch_ao_ms']:.3f} "
                         f"ms  x{row['speedup']:.2f}  same bits: {row['same_bits']}" if "error" not in row
                         else f"failed: {row['error']}"), flush=True)
    return rows


def _module_timings(case: _Case, observing: bool, w: torch.Tensor, dy: torch.Tensor, config: QatBenchConfig) -> dict:
    ours, theirs = case.ours().cuda(), case.theirs().cuda()
    if not observing:  # parameters from one observed step, then frozen
        for module in (ours, theirs):
            module(w.detach())
            module.disable_observer()
    ours_ms = step_ms(ours, w, dy, config.steps, config.repeats)
    theirs_ms = step_ms(theirs, w, dy, config.steps, config.repeats)
    return {"ms": ours_ms, "torch_ao_ms": theirs_ms, "speedup": theirs_ms / ours_ms,
            "host_us": bench.host_us(_step(ours, w, dy), calls=200), "same_bits": _same_step(case, w, dy)}


def _kernel_cases(w: torch.Tensor, dy: torch.Tensor) -> list[tuple[str, int, Callable, Callable | None, str]]:
    """``(op, bytes it must move, ours, PyTorch's or None, PyTorch's name)`` on a per-channel weight ``w``."""
    n, size = w.numel(), w.element_size()
    scales = w.float().abs().amax(dim=1) / 127.5
    zps = torch.zeros(w.shape[0], device=w.device, dtype=torch.int32)
    wr = w.clone().requires_grad_()

    def ours_both():
        ops.fake_quantize_with_grad("channel", wr, scales, zps, 0, -128, 127).backward(dy)
        wr.grad = None

    def theirs_both():
        torch.fake_quantize_per_channel_affine(wr, scales, zps, 0, -128, 127).backward(dy)
        wr.grad = None

    return [
        ("forward", 2 * n * size, lambda: bn.fake_quantize_per_channel(w, scales, zps, 0),
         lambda: torch.fake_quantize_per_channel_affine(w, scales, zps, 0, -128, 127),
         "fake_quantize_per_channel_affine"),
        ("backward", 3 * n * size, lambda: bn.fake_quantize_per_channel_backward(dy, w, scales, zps, 0), None, ""),
        ("forward + backward", 5 * n * size, ours_both, theirs_both, "its forward + autograd backward"),
    ]


def kernel_rows(config: QatBenchConfig, copy_gbs: float) -> list[dict]:
    rows = []
    for name in config.dtypes:
        g = torch.Generator(device="cuda").manual_seed(1)
        w = (torch.randn(config.shape, device="cuda", generator=g) * 0.02).to(TORCH[name])
        dy = torch.randn(config.shape, device="cuda", generator=g).to(TORCH[name])
        for op, nbytes, ours, theirs, torch_name in _kernel_cases(w, dy):
            ms = bench.device_ms(ours, config.repeats * 4)
            row = {"section": "qat kernel", "op": op, "dtype": name, "shape": list(config.shape), "ms": ms,
                   "GB/s": nbytes / ms / 1e6, "pct_copy": 100 * nbytes / ms / 1e6 / copy_gbs}
            if theirs is not None:
                row["torch_op"] = torch_name
                try:
                    torch_ms = bench.device_ms(theirs, config.repeats * 4)
                    row.update({"torch_ms": torch_ms, "speedup": torch_ms / ms})
                except Exception as exc:  # PyTorch's op refusing this dtype, say: the row says so
                    row["torch_error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
            rows.append(row)
            print(f"qat kernel {name} {op:<20} {row['GB/s']:6.0f} GB/s {row['pct_copy']:5.1f}% of copy"
                  + (f"  torch {row['torch_ms'] * 1e3:.1f} us  x{row['speedup']:.2f}" if "torch_ms" in row else ""),
                  flush=True)
    return rows


def copy_bandwidth(repeats: int) -> float:
    """GB/s of a device-to-device copy of 2^28 float32 (past L2), as :mod:`baracuda_numba.bench` measures it."""
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    ms = bench.device_ms(lambda: dst.copy_(src), repeats)
    return 8 * (1 << 28) / ms / 1e6


def run(config: QatBenchConfig = QatBenchConfig(), copy_gbs: float = 0.0) -> list[dict]:
    """Every row (module rows, then kernel rows); ``copy_gbs``: the run's copy bandwidth (0: measured here)."""
    copy_gbs = copy_gbs or copy_bandwidth(config.repeats * 4)
    return module_rows(config) + kernel_rows(config, copy_gbs)


def markdown(rows: list[dict]) -> str:
    modules = [r for r in rows if r["section"] == "qat module"]
    kernels = [r for r in rows if r["section"] == "qat kernel"]
    lines = []
    if modules:
        shape = "x".join(map(str, modules[0]["shape"]))
        lines += [f"QAT: FakeQuantize forward + backward of a [{shape}] weight against torch.ao's FakeQuantize "
                  "(ms per step on the GPU timeline, host gaps included; our host time per step apart):", "",
                  "| fake quantize | observer | dtype | ours ms | host us | torch.ao ms | speedup | same bits |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        lines += [f"| {r['case']} | {'on' if r['observer'] else 'off'} | {r['dtype']} | "
                  + (f"{r['ms']:.3f} | {r['host_us']:.0f} | {r['torch_ao_ms']:.3f} | {r['speedup']:.2f}x | "
                     f"{'yes' if r['same_bits'] else 'NO'} |" if "error" not in r
                     else f"failed: {r['error'].replace('|', '/')} | | | | |")
                  for r in modules]
    if kernels:
        lines += ["", "QAT kernels, per channel (GPU time behind a busy wait; GB/s on the bytes moved):", "",
                  "| op | dtype | us | GB/s | % of copy | PyTorch | PyTorch us | speedup |",
                  "|---|---|---:|---:|---:|---|---:|---:|"]
        lines += [f"| {r['op']} | {r['dtype']} | {1e3 * r['ms']:.1f} | {r['GB/s']:.0f} | {r['pct_copy']:.1f}% | "
                  + (f"{r['torch_op']} | {1e3 * r['torch_ms']:.1f} | {r['speedup']:.2f}x |" if "torch_ms" in r
                     else f"{r.get('torch_op', '')} | {r.get('torch_error', '').replace('|', '/')} | |")
                  for r in kernels]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baracuda_numba.torch.benchmark_qat",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=2, default=[4096, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=sorted(TORCH))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="directory for qat.json / qat.md")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark_qat: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    print(f"{device}", flush=True)
    rows = run(QatBenchConfig(tuple(args.shape), tuple(args.dtypes), args.steps, args.repeats))
    text = f"device: {device}\n\n" + markdown(rows)
    print("\n" + text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "qat.md").write_text(text)
        (out / "qat.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
