"""A tiny chat model that speaks tools: a character tokenizer (lossless decoding) with ChatML's special tokens and
TRL's own Qwen2.5 tool template (byte-identical, so TRL recognises it), a tiny Qwen2, and a scripted rollout
engine that writes given turns, so that a multi-turn rollout's ids are known in advance."""

import torch
from tiny_models import QWEN2_SPECIALS, char_tokenizer
from tokenizers import decoders

from trl_ext.agents.templates import tool_template
from trl_ext.ppo.rollout.interface import Completions, Sampler


def tool_tokenizer():
    tok = char_tokenizer(
        QWEN2_SPECIALS,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=QWEN2_SPECIALS[1:],
    )
    tok.backend_tokenizer.decoder = decoders.Fuse()  # characters back to text, spaces and newlines kept
    tok.chat_template = tool_template("qwen2_5")
    return tok


def tiny_tool_model(path, seed: int = 0, hidden_size: int = 32, heads: int = 4):
    """A tiny Qwen2 and its tool tokenizer saved in ``path``; 2048 positions (the tools' schemas are long in
    characters). vLLM's CPU attention needs a head size it knows (32 and up: ``hidden_size=64, heads=2``)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tool_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def call_text(name: str, arguments: dict) -> str:
    """A tool call as Qwen2.5's template writes it (what a model trained on it samples)."""
    import json

    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class ScriptedSampler(Sampler):
    """Writes ``turns[k]`` (text, then eos) as the k-th assistant turn of a rollout, k counted from the tool
    responses already in its query; ``rows`` maps a text in a prompt to that prompt's own turns. With an
    ``engine``, the turns past the script are that rollout engine's (a real one, on the multi-turn queries)."""

    def __init__(self, tokenizer, turns: list[str], rows: dict[str, list[str]] | None = None, engine=None):
        self.tokenizer, self.turns, self.rows, self.engine = tokenizer, turns, rows or {}, engine
        self.calls, self.engine_queries = 0, []

    def sample(self, model, query_ids, query_mask, options, generator=None):
        self.calls += 1
        if self.engine is not None and self.calls > len(self.turns):
            self.engine_queries.append(query_ids.shape)
            return self.engine.sample(model, query_ids, query_mask, options, generator)
        out = []
        for ids, mask in zip(query_ids, query_mask):
            text = self.tokenizer.decode(ids[mask.bool()])
            turns = next((t for key, t in self.rows.items() if key in text), self.turns)
            turn = turns[min(text.count("<tool_response>"), len(turns) - 1)]
            new = self.tokenizer(turn, add_special_tokens=False)["input_ids"] + [options.eos_token_id]
            out.append(new[: options.max_new_tokens])
        width = max(len(ids) for ids in out)
        padded = [ids + [options.pad_token_id] * (width - len(ids)) for ids in out]
        return Completions(torch.tensor(padded, device=query_ids.device))
