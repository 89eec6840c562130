"""``baracuda_numba.torch.evaluate.load_model``: its model is the one ``from_pretrained`` gives in that dtype."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
transformers = pytest.importorskip("transformers", reason="the Hugging Face tests need transformers ([test-torch])")

from baracuda_numba.torch.evaluate import load_model  # noqa: E402


def test_a_bf16_load_keeps_float32_rotary_buffers_and_survives_a_save_and_load(tmp_path, monkeypatch):
    """``load()`` in bf16 keeps the rotary embedding's ``inv_freq`` in float32, as ``from_pretrained(dtype=bf16)``
    builds it, so the two give the same logits bit for bit, and so does the model saved and loaded back. Rounded to
    bf16 (``.to(dtype)`` alone) it moved every position's angle: a saved SmolLM2 came back with other logits."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "float")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: None)  # none saved
    load, _ = load_model(tmp_path / "float", dtype=torch.bfloat16)
    model = load()
    assert next(model.parameters()).dtype is torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype is torch.float32
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
        direct = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "float", dtype=torch.bfloat16).eval()
        assert torch.equal(direct(ids).logits, logits)
        model.save_pretrained(tmp_path / "bf16")
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").eval()
        assert torch.equal(again(ids).logits, logits)
