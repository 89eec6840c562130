"""The model-level and QAT benchmarks without a GPU: a tiny Llama through the eager sections on the simulator,
the pure-PyTorch W8A8 emulation against W8A8Linear, a failing mode reported as a row, the tables."""

from __future__ import annotations

import statistics

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
pytest.importorskip("transformers", reason="the model benchmark needs transformers (the [test-torch] extra)")

from baracuda_numba import cli  # noqa: E402
from baracuda_numba.torch import W8A8Linear  # noqa: E402
from baracuda_numba.torch import benchmark_model as bm  # noqa: E402
from baracuda_numba.torch import benchmark_qat as bq  # noqa: E402
from tests.conftest import SIMULATOR  # noqa: E402

DEVICE = "cpu" if SIMULATOR else "cuda"

# One layer, hidden 64, float32 (the simulator has no bf16); one projection quantized, since the simulator
# emulates every tensor-core step of a W8A8 GEMM in Python (seconds a call).
TINY = bm.ModelBenchConfig(hidden=64, intermediate=128, heads=2, layers=1, vocab=128, dtype="float32", device=DEVICE,
                           sections=("decode", "prefill"), modes=("eager",), batches=(1,), prompt=0, warmup=0,
                           steps=1, rounds=2, prefill=(1, 2), prefill_repeats=1, calibration=(1, 1, 8),
                           include=("*.self_attn.q_proj",), fidelity_tokens=(1, 8), compile_backend="aot_eager")


def test_tiny_model_benchmark_runs_the_eager_sections():
    rows = bm.run(TINY)
    assert rows[0]["section"] == "config" and rows[0]["layers"] == 1 and rows[0]["device"]
    decode = {r["model"]: r for r in rows if r["section"] == "decode"}
    prefill = {r["model"]: r for r in rows if r["section"] == "prefill"}
    assert set(decode) == set(prefill) == {bm.BF16, bm.DYNAMIC, bm.STATIC}
    for row in (*decode.values(), *prefill.values()):
        assert row["status"] == "ok", row
        assert row["ms"] > 0 and row["speedup_vs_bf16"] > 0
    for name, row in decode.items():
        assert row["mode"] == "eager" and row["batch"] == 1 and row["rounds"] == 2
        assert row["tokens_per_s"] == pytest.approx(1e3 / row["ms"])
        paired = [b / m for m, b in zip(row["round_ms"], decode[bm.BF16]["round_ms"], strict=True)]
        assert row["speedup_vs_bf16"] == pytest.approx(statistics.median(paired)), name  # round by round
    assert prefill[bm.DYNAMIC]["tokens_per_s"] == pytest.approx(2e3 / prefill[bm.DYNAMIC]["ms"])
    text = bm.markdown(rows)
    assert "| W8A8 static + SmoothQuant | eager | 1 |" in text and "hidden 64" in text


def test_quantized_models_follow_their_recipes():
    base = bm.build_llama(TINY)
    dynamic = bm.quantized_model(base, bm.DYNAMIC, TINY)
    static = bm.quantized_model(base, bm.STATIC, TINY)
    for model, activation in ((dynamic, "dynamic"), (static, "static")):
        layer = model.model.layers[0].self_attn.q_proj
        assert isinstance(layer, W8A8Linear) and layer.activation == activation
        assert type(model.model.layers[0].self_attn.k_proj) is torch.nn.Linear  # not selected
    assert type(base.model.layers[0].self_attn.q_proj) is torch.nn.Linear  # the bf16 model is left alone


def test_emulation_gives_the_bits_of_w8a8_linear():
    torch.manual_seed(3)
    linear = torch.nn.Linear(64, 64).to(DEVICE)
    layer = W8A8Linear.from_float(linear)
    x = torch.randn(2, 64, device=DEVICE) * 3
    x[1] = 0  # an all-zero row: scale 1
    with torch.no_grad():
        assert torch.equal(bm.EmulatedW8A8Linear(layer)(x), layer(x))


def test_emulated_model_swaps_every_w8a8_layer_and_leaves_the_original():
    base = bm.build_llama(TINY)
    dynamic = bm.quantized_model(base, bm.DYNAMIC, TINY)
    emulated = bm.emulated_model(dynamic)
    assert isinstance(emulated.model.layers[0].self_attn.q_proj, bm.EmulatedW8A8Linear)
    assert isinstance(dynamic.model.layers[0].self_attn.q_proj, W8A8Linear)
    assert not any(isinstance(m, W8A8Linear) for m in emulated.modules())


def test_host_bound_modes_interleave_the_models_and_report_the_median_round(monkeypatch):
    # every round times each model once, in turn, so a drift of the host's speed reaches all of them alike
    timed, samples = [], {"a": iter([5.0, 1.0, 3.0]), "b": iter([9.0, 2.0, 4.0])}

    def prepare(decoder):  # a prepared step that says whose it is
        decoder.step = lambda name=decoder.row["model"]: name

    def timed_ms(step, count, device):
        assert count == 7
        timed.append(step())
        return next(samples[timed[-1]])

    monkeypatch.setattr(bm._Decoder, "prepare", prepare)
    monkeypatch.setattr(bm, "_timed_ms", timed_ms)
    config = bm.ModelBenchConfig(**{**TINY.__dict__, "rounds": 3, "steps": 7})
    rows = bm.decode_rows({"a": None, "b": None}, "eager", config)
    assert timed == ["a", "b"] * 3
    assert [(r["model"], r["ms"], r["rounds"]) for r in rows] == [("a", 3.0, 3), ("b", 4.0, 3)]
    assert rows[1]["spread"] == pytest.approx((9.0 - 2.0) / 4.0)


def test_interleaved_rows_compare_with_bf16_round_by_round():
    # the host slowed down by half in the second round: the ratio of each round is 1.25, the ratio of the medians
    # (4.5 / 3.6) is not, and rows timed once (graph replay, prefill) still take the ratio of their times
    rows = [{"section": "decode", "model": bm.BF16, "mode": "eager", "batch": 1, "status": "ok", "ms": 4.5,
             "round_ms": [3.0, 6.0, 4.5]},
            {"section": "decode", "model": bm.DYNAMIC, "mode": "eager", "batch": 1, "status": "ok", "ms": 3.6,
             "round_ms": [2.4, 4.8, 3.6]},
            {"section": "decode", "model": bm.BF16, "mode": "reduce-overhead", "batch": 1, "status": "ok", "ms": 1.0,
             "round_ms": [1.0]},
            {"section": "decode", "model": bm.DYNAMIC, "mode": "reduce-overhead", "batch": 1, "status": "ok",
             "ms": 0.8, "round_ms": [0.8]}]
    rows[1]["round_ms"] = [2.4, 4.0, 3.6]  # 1.25, 1.5, 1.25
    ratios = [r["speedup_vs_bf16"] for r in bm._with_ratios(rows)]
    assert ratios == [1.0, 1.25, 1.0, pytest.approx(1.25)]


def test_a_failing_mode_is_a_row_with_its_error():
    def failing(graph_module, example_inputs):
        raise RuntimeError("Detected 2 tensor(s) in the cudagraph pool not tracked as outputs.")

    config = bm.ModelBenchConfig(**{**TINY.__dict__, "compile_backend": failing})
    model = bm.build_llama(config)
    row = bm.decode_row(model, bm.BF16, "compile", 1, config)
    assert row["status"] == "failed" and "Detected 2 tensor(s) in the cudagraph pool" in row["error"]
    assert "ms" not in row
    text = bm.markdown([row])
    assert "**failed**" in text and "cudagraph pool" in text


def test_fidelity_rows_compare_compiled_and_eager_logits():
    config = bm.ModelBenchConfig(**{**TINY.__dict__, "sections": ("fidelity",),
                                    "fidelity_models": (bm.BF16, bm.EMULATED)})
    rows = bm.run(config)
    fidelity = {r["model"]: r for r in rows if r["section"] == "fidelity"}
    assert set(fidelity) == {bm.BF16, bm.EMULATED}
    for row in fidelity.values():  # aot_eager runs the same kernels: no difference
        assert row["status"] == "ok" and row["rel_error"] == 0 and row["top1_agreement"] == 1
        assert row["rel_error_emulated_casts"] == 0


def test_markdown_tables_of_every_section():
    rows = [{"section": "config", "device": "GPU", "layers": 4, "hidden": 4096, "intermediate": 11008, "heads": 32,
             "vocab": 32000, "dtype": "bfloat16", "quantized": ["*"]},
            {"section": "decode", "model": bm.BF16, "mode": "compile", "batch": 16, "ms": 2.0, "tokens_per_s": 8000.0,
             "first_calls_s": 12.5, "speedup_vs_bf16": 1.0, "rounds": 5, "spread": 0.04, "status": "ok"},
            {"section": "decode", "model": bm.DYNAMIC, "mode": "reduce-overhead", "batch": 1, "status": "failed",
             "error": "RuntimeError: a | b"},
            {"section": "prefill", "model": bm.DYNAMIC, "batch": 4, "tokens": 512, "ms": 8.0, "tokens_per_s": 256000.0,
             "speedup_vs_bf16": 1.1, "status": "ok"},
            {"section": "projections", "model": bm.DYNAMIC, "tokens": 16, "projections": 56, "ms": 0.7,
             "speedup_vs_bf16": 1.4, "status": "ok"},
            {"section": "host", "layer": "nn.Linear", "shape": "4096x4096", "tokens": 1, "us": 18.5, "status": "ok"},
            {"section": "fidelity", "model": bm.EMULATED, "rel_error": 0.012, "top1_agreement": 0.99,
             "rel_error_emulated_casts": 0.0005, "status": "ok"}]
    text = bm.markdown(rows)
    assert "Model benchmark on GPU: a Llama of 4 layers" in text
    assert "| bf16 | compile | 16 | 2.000 | 8000 | 1.00 | 5 | 4% | 12.5 | ok |" in text
    assert "**failed**: RuntimeError: a / b" in text
    assert "| W8A8 dynamic | 4 x 512 | 8.00 | 256000 | 1.10 | ok |" in text
    assert "| W8A8 dynamic | 16 | 56 | 0.700 | 1.40 | ok |" in text
    assert "| nn.Linear | 4096x4096 | 1 | 18.5 | ok |" in text
    assert "| W8A8 emulated (PyTorch) | 1.200e-02 | 0.9900 | 5.000e-04 | ok |" in text


def test_bench_command_passes_its_options_to_the_benchmark():
    args = cli._parser().parse_args(["bench", "--only", "model", "qat", "--out", "x"])
    assert (args.only, args.out) == (["model", "qat"], "x")


@pytest.mark.parametrize("case", bq.CASES, ids=lambda c: c.label.split(" (")[0])
def test_qat_benchmark_cases_agree_with_torch_ao(case):
    # what each module row reports as "same bits", here on float32 (bf16 on the GPU)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(8, 32, generator=g) * 0.02).to(DEVICE)
    dy = torch.randn(8, 32, generator=g).to(DEVICE)
    assert bq._same_step(case, w, dy)


def test_qat_markdown():
    rows = [{"section": "qat module", "case": bq.CASES[0].label, "observer": True, "dtype": "bf16",
             "shape": [4096, 4096], "ms": 0.2, "torch_ao_ms": 0.8, "speedup": 4.0, "host_us": 150.0,
             "same_bits": True},
            {"section": "qat kernel", "op": "forward", "dtype": "bf16", "shape": [4096, 4096], "ms": 0.025,
             "GB/s": 2700.0, "pct_copy": 90.0, "torch_op": "fake_quantize_per_channel_affine", "torch_ms": 0.1,
             "speedup": 4.0}]
    text = bq.markdown(rows)
    assert "[4096x4096] weight" in text and "| on | bf16 | 0.200 | 150 | 0.800 | 4.00x | yes |" in text
    assert "| forward | bf16 | 25.0 | 2700 | 90.0% | fake_quantize_per_channel_affine | 100.0 | 4.00x |" in text


def test_compiled_decode_traces_one_graph_with_a_static_cache():
    # torch.compile(fullgraph=True) over the decode step and its StaticCache (aot_eager: tracing without
    # code generation); the GPU runs the same with Inductor and with CUDA graphs
    config = bm.ModelBenchConfig(**{**TINY.__dict__, "prompt": 3, "warmup": 2, "steps": 2})
    row = bm.decode_row(bm.build_llama(config), bm.BF16, "compile", 2, config)
    assert row["status"] == "ok", row
    assert row["first_calls_s"] > 0 and row["ms"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU: CUDA graphs, Inductor, host time behind a busy wait")
def test_gpu_small_model_benchmark_every_section():
    """Every section and mode on a small Llama: each row is measured or failed with its error, none crashes."""
    config = bm.ModelBenchConfig(hidden=512, intermediate=1024, heads=4, layers=1, vocab=1024, prompt=8, warmup=3,
                                 steps=4, prefill=(2, 64), calibration=(1, 1, 64), projection_layers=2,
                                 projection_tokens=(1, 16), host_calls=100, fidelity_tokens=(1, 16))
    rows = bm.run(config)
    sections = {r["section"] for r in rows}
    assert sections == {"config", "decode", "prefill", "projections", "host", "fidelity"}
    decode = [r for r in rows if r["section"] == "decode"]
    assert len(decode) == 3 * 3 * 2
    for row in rows[1:]:
        assert row["status"] == "ok" or row["error"], row
    for row in decode:  # CUDA graphs included: the W8A8 workspaces keep no block of a graph's pool
        assert row["status"] == "ok", row
    fidelity = {r["model"]: r for r in rows if r["section"] == "fidelity"}
    assert fidelity[bm.BF16]["status"] == "ok" and fidelity[bm.BF16]["rel_error"] < 0.05
    assert "| bf16 | reduce-overhead | 16 |" in bm.markdown(rows)
    host = [r for r in rows if r["section"] == "host"]
    assert len(host) == 3 * 2 * 5 and all(r["status"] == "ok" and r["us"] > 0 for r in host)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU")
def test_gpu_qat_benchmark_small():
    rows = bq.run(bq.QatBenchConfig(shape=(256, 1024), dtypes=("bf16",), steps=3, repeats=2), copy_gbs=1000.0)
    modules = [r for r in rows if r["section"] == "qat module"]
    assert len(modules) == 2 * len(bq.CASES) and all(r["same_bits"] for r in modules)
    assert len([r for r in rows if r["section"] == "qat kernel"]) == 3
