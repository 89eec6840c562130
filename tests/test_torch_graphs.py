"""A W8A8 Llama under CUDA graphs on a GPU: ``torch.compile(model.forward, mode="reduce-overhead")`` with a
``StaticCache`` (the way Hugging Face recommends for fast generation) and plain ``torch.cuda.graph`` capture of the
forward, for dynamic and for static + SmoothQuant activations.

Reduce-overhead warms each graph up with every allocation in the graph's private pool and refuses a pool holding a
block no output owns; the W8A8 calls keep their eager workspace in driver memory (:mod:`baracuda_numba.workspace`),
and a captured call's workspace in the pool only while it runs (``tests/test_linear_fast.py`` checks both on the
simulator). The simulator has no CUDA graphs: everything here is GPU only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
pytest.importorskip("transformers", reason="the Llama model needs transformers (the [test-torch] extra)")

from baracuda_numba.torch import benchmark_model as bm  # noqa: E402
from tests.conftest import requires_gpu  # noqa: E402

pytestmark = [requires_gpu, pytest.mark.gpu]

# Two layers of a small Llama: K % 16 == 0 everywhere (the aligned kernels), M = 1 and 4 at decode (the fused kernel,
# which a capture replaces by the two launches, and the quantizer with the skinny GEMM).
SMALL = bm.ModelBenchConfig(hidden=512, intermediate=1024, heads=8, layers=2, vocab=1024, dtype="bfloat16",
                            device="cuda", calibration=(2, 1, 64))
RECIPES = (bm.DYNAMIC, bm.STATIC)


@pytest.fixture(scope="module")
def models():
    base = bm.build_llama(SMALL)
    return {name: bm.quantized_model(base, name, SMALL) for name in RECIPES}


def _tokens(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL.vocab, (batch, length), generator=g).cuda()


def _relative(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("recipe", RECIPES)
def test_reduce_overhead_decode_with_a_static_cache_replays_the_compiled_steps(models, recipe, batch):
    """Decode steps under ``mode="reduce-overhead"`` give the logits of the same compiled steps without CUDA graphs,
    bit for bit (the graphs replay what the default mode runs), and stay close to eager ones (Inductor's bf16 norms
    differ from eager's by an ulp here and there, which an int8 rounding can amplify)."""
    model = models[recipe]
    prompt, tokens = _tokens(batch, 8, 1), _tokens(batch, 6, 2)
    eager = bm.decode_logits(model, "eager", tokens, SMALL, prompt)
    compiled = bm.decode_logits(model, "compile", tokens, SMALL, prompt)
    graphs = bm.decode_logits(model, "reduce-overhead", tokens, SMALL, prompt)
    assert len(graphs) == len(compiled) == len(eager) == tokens.shape[1]
    for step, (g, c, e) in enumerate(zip(graphs, compiled, eager, strict=True)):
        assert torch.equal(g, c), (step, _relative(g, c))
        assert _relative(g, e) < 5e-2, (step, _relative(g, e))
    agree = torch.stack([(g.argmax(-1) == e.argmax(-1)).float().mean() for g, e in zip(graphs, eager, strict=True)])
    assert agree.mean().item() > 0.8


@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (2, 48)])
@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_graph_capture_of_the_forward_replays_eager_bits(models, recipe, shape):
    """``torch.cuda.graph`` around the quantized model's forward (warmed up on a side stream, as PyTorch's docs
    say): a replay on new tokens gives the eager logits of those tokens bit for bit, at decode shapes and a
    prefill."""
    model = models[recipe]
    ids = _tokens(*shape, 3)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                model(input_ids=ids, use_cache=False)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = model(input_ids=ids, use_cache=False).logits
        for seed in (4, 5):
            ids.copy_(_tokens(*shape, seed))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(captured, model(input_ids=ids, use_cache=False).logits), seed


def test_reduce_overhead_keeps_no_block_of_the_graph_pool_past_a_call(models):
    """PyTorch's own check of the warm-up (``check_memory_pool``, on by default) passes, and once the graphs are
    recorded the pool holds their outputs only: a second compiled model warms up in the same pool."""
    from torch._inductor import config

    assert config.triton.slow_path_cudagraph_asserts  # the check that failed before the driver workspaces
    tokens = _tokens(1, 3, 6)
    first = bm.decode_logits(models[bm.DYNAMIC], "reduce-overhead", tokens, SMALL, _tokens(1, 4, 7))
    second = bm.decode_logits(models[bm.STATIC], "reduce-overhead", tokens, SMALL, _tokens(1, 4, 7))
    assert len(first) == len(second) == 3
