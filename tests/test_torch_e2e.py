"""A Hugging Face causal LM (built from a config, random weights, no download) quantized W8A8 end to end.

Simulator: toy sizes on torch CPU tensors. GPU: a size where the numbers mean something, bf16,
tokens/s, torch.compile and CUDA-graph capture.
"""

from __future__ import annotations

import copy
import time

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
transformers = pytest.importorskip("transformers", reason="end-to-end tests need transformers (the [test-torch] extra)")

from baracuda_numba.torch import (  # noqa: E402
    QuantizeConfig,
    W8A8Linear,
    compare_logits,
    prepare_qat,
    quantize_model,
)
from tests.conftest import SIMULATOR, requires_gpu  # noqa: E402

DEVICE = "cpu" if SIMULATOR else "cuda"


def tiny_llama(hidden=32, layers=1, vocab=64, seed=0, outlier_channels=(3,)):
    """A Llama with random weights; a few RMSNorm channels scaled up, as LLM activation outliers are."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                                      max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("layernorm"):
                module.weight[list(outlier_channels)] = 20.0
    return model.to(DEVICE)


def tiny_opt(hidden=32, layers=1, vocab=64, seed=0):
    torch.manual_seed(seed)
    config = transformers.OPTConfig(vocab_size=vocab, hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers,
                                    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=hidden)
    return transformers.OPTForCausalLM(config).eval().to(DEVICE)


def _tokens(batches, length, vocab=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, length), generator=g).to(DEVICE) for _ in range(batches)]


def schemes(include=("*",)):
    """The three W8A8 recipes, on the linears matching ``include``."""
    include = list(include)
    return {
        "W8A8 dynamic": QuantizeConfig(include=include, progress=False),
        "W8A8 dynamic + smooth": QuantizeConfig(include=include, smooth=True, alpha=0.5, progress=False),
        "W8A8 static + smooth": QuantizeConfig(include=include, activation="static", smooth=True, alpha=0.5,
                                               progress=False),
    }


# The simulator emulates each mma in Python (~5 s per toy GEMM): there, only the linears fed by one
# norm are converted (so smoothing still applies); on a GPU every linear but lm_head.
SIMULATOR_LAYERS = {"llama": ["*.mlp.gate_proj", "*.mlp.up_proj"], "opt": ["*.fc1"]}


def quantize_and_compare(factory, calibration, evaluation, include=("*",)):
    """``{scheme: {"rel_error", "top1_agreement"}}`` of each scheme's logits against the float model."""
    reference_model = factory()
    with torch.no_grad():
        reference = [reference_model(t).logits for t in evaluation]
    table = {}
    for scheme, config in schemes(include).items():
        model = quantize_model(copy.deepcopy(reference_model), [{"input_ids": t} for t in calibration], config)
        assert any(isinstance(m, W8A8Linear) for m in model.modules())
        with torch.no_grad():
            logits = torch.cat([model(t).logits for t in evaluation], dim=1)
        table[scheme] = compare_logits(torch.cat(reference, dim=1), logits)
    return table


@pytest.mark.parametrize("factory", [tiny_llama, tiny_opt], ids=["llama", "opt"])
def test_causal_lm_w8a8_toy(factory):
    include = SIMULATOR_LAYERS[factory.__name__.removeprefix("tiny_")] if SIMULATOR else ["*"]
    table = quantize_and_compare(factory, _tokens(2, 6), _tokens(1, 6, seed=7), include)
    print("\n" + "\n".join(f"{factory.__name__} {k}: {v}" for k, v in table.items()))
    for scheme, row in table.items():
        assert row["rel_error"] < 0.1, (scheme, row)
        assert row["top1_agreement"] >= 0.5, (scheme, row)


def test_smoothing_folds_into_llama_norms():
    from baracuda_numba.torch import calibrate

    model = tiny_llama()
    calibration = calibrate(model, [{"input_ids": t} for t in _tokens(1, 4)], QuantizeConfig(progress=False))
    assert calibration.norm_consumers == {
        "model.layers.0.input_layernorm": ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                                           "model.layers.0.self_attn.v_proj"],
        "model.layers.0.post_attention_layernorm": ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"],
    }


def test_qat_loss_goes_down():
    model = prepare_qat(tiny_llama(), QuantizeConfig())
    model.train()
    tokens = _tokens(1, 8)[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(4):
        loss = model(tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    assert all(p.grad is not None for n, p in model.named_parameters() if "proj.weight" in n)


def test_quantized_llama_compiles_fullgraph():
    # Dynamo + AOTAutograd over the whole Hugging Face model with a W8A8Linear inside (aot_eager: no
    # Inductor build; the GPU test below uses Inductor and a CUDA graph).
    model = quantize_model(tiny_llama(), None, QuantizeConfig(include=["*.mlp.up_proj"], progress=False))
    tokens = _tokens(1, 4)[0]
    with torch.no_grad():
        eager = model(tokens).logits
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(tokens).logits, eager)


# -- GPU: a size where the numbers mean something --------------------------------------------------


def _bench(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


@requires_gpu
def test_causal_lm_w8a8_gpu_table():
    def factory():
        return tiny_llama(hidden=1024, layers=4, vocab=4096, outlier_channels=(3, 77, 500)).to(torch.bfloat16)

    calibration = _tokens(8, 128, vocab=4096)
    evaluation = _tokens(4, 128, vocab=4096, seed=7)
    table = quantize_and_compare(factory, calibration, evaluation)
    batch = torch.cat(_tokens(8, 256, vocab=4096, seed=9))
    bf16 = factory()
    quantized = quantize_model(factory(), [{"input_ids": t} for t in calibration], QuantizeConfig(progress=False))
    with torch.no_grad():
        t_ref = _bench(lambda: bf16(batch))
        t_q = _bench(lambda: quantized(batch))
    print("\n| scheme | logits rel. error | top-1 agreement |\n|---|---|---|")
    for scheme, row in table.items():
        print(f"| {scheme} | {row['rel_error']:.4f} | {row['top1_agreement']:.4f} |")
    print(f"tokens/s (batch 8 x 256, prefill): bf16 {batch.numel() / t_ref:.0f}, W8A8 dynamic "
          f"{batch.numel() / t_q:.0f}  ({torch.cuda.get_device_name()})")
    # random weights with outlier channels x20: per-token int8 activations lose the small channels unless
    # SmoothQuant moves the outliers into the weights, which is what this table shows
    for row in table.values():
        assert row["rel_error"] < 0.25 and row["top1_agreement"] > 0.5
    assert table["W8A8 dynamic + smooth"]["rel_error"] < table["W8A8 dynamic"]["rel_error"]


@requires_gpu
def test_quantized_model_compiles_and_captures_in_a_cuda_graph():
    model = quantize_model(tiny_llama(hidden=256, layers=2, vocab=512).to(torch.bfloat16), None,
                           QuantizeConfig(progress=False))
    tokens = _tokens(1, 32, vocab=512)[0]
    with torch.no_grad():
        eager = model(tokens).logits
        compiled = torch.compile(model, fullgraph=True)
        # Inductor fuses the bf16 norms and activations differently, which can move an activation across
        # an int8 rounding boundary: compare the logits as a whole, not element by element
        got = compiled(tokens).logits.float()
        rel_error = ((got - eager.float()).norm() / eager.float().norm()).item()
        top1 = (got.argmax(-1) == eager.argmax(-1)).float().mean().item()
        print(f"\ncompiled vs eager (quantized bf16 Llama): logits rel. error {rel_error:.4f}, top-1 {top1:.3f}")
        assert rel_error < 5e-2 and top1 > 0.9
        static_tokens = tokens.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                model(static_tokens)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits = model(static_tokens).logits
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_logits, eager, rtol=0, atol=0)
