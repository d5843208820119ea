"""The weights digest the two-rank tests and the demo's summary compare ranks by: equal for bit-equal weights
(a model and its reload), different at one flipped bit, a moved weight or another shape of the same bytes."""

import torch

from trl_ext.models.digest import weights_digest


def _flip_lowest_bit(tensor: torch.Tensor) -> torch.Tensor:
    bits = tensor.clone().view(torch.int32)
    bits.view(-1)[0] ^= 1
    return bits.view(torch.float32)


def test_equal_weights_have_one_digest_and_a_reload_keeps_it(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16))
    model.save_pretrained(tmp_path)
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert weights_digest(model.parameters()) == weights_digest(reloaded.parameters())


def test_one_flipped_bit_a_swap_or_a_reshape_changes_the_digest():
    a, b = torch.randn(4, 6), torch.randn(6)
    digest = weights_digest([a, b])
    flipped = _flip_lowest_bit(a)
    assert 0 < (flipped - a).abs().max() < 1e-6
    assert weights_digest([flipped, b]) != digest
    assert weights_digest([b, a]) != digest
    assert weights_digest([a.reshape(6, 4), b]) != digest
    assert weights_digest([a.to(torch.bfloat16), b]) != weights_digest([a.to(torch.float16), b])
    assert weights_digest([a.clone(), b.clone()]) == digest
