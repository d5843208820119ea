"""Tiny, randomly initialised models of real architectures, and character tokenizers for them."""

import string

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

CHARS = sorted(set(string.printable) - set("\x0b\x0c"))


def char_tokenizer(specials: list[str], template: bool = False, **special_roles) -> PreTrainedTokenizerFast:
    """One token per printable character; ``template`` adds BERT-style [CLS] A [SEP] (B [SEP]) framing."""
    vocab = {tok: i for i, tok in enumerate(specials + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=special_roles.get("unk_token", specials[0])))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    if template:
        cls, sep = special_roles["cls_token"], special_roles["sep_token"]
        core.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
        )
    return PreTrainedTokenizerFast(tokenizer_object=core, **special_roles)


def word_tokenizer():
    return char_tokenizer(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
        template=True,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )


# A ChatML-like template written in printable characters, so the character tokenizer can spell it.
CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


# The chat template Qwen2.5-*-Instruct checkpoints ship (tokenizer_config.json; TRL keeps a copy as
# trl/chat_templates/qwen2_5.jinja), with the special tokens it names: what a real instruct model renders.
# Its lines over 120 characters are cut into raw strings that run together: the text is the shipped one.
QWEN2_5_CHAT_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with """
    r"""function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within """
    r"""<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": """
    r"""<args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" """
    r"""and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
)
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# The vocabularies of the real checkpoints: tiny width keeps even these embeddings small.
QWEN2_VOCAB, DEBERTA_V2_VOCAB = 151936, 128100


def tiny_qwen2(
    path, chat_template: bool | str = False, vocab_size: int | None = None, dtype=None, initializer_range: float = 0.02
):
    """``vocab_size``: rows beyond the character tokenizer's (a real checkpoint's size); ``dtype``: saved in it.
    ``chat_template``: True, the short ChatML-like one; "qwen2.5", Qwen2.5-Instruct's own, with its special
    tokens (<|im_start|>, <|im_end|> the eos, <|endoftext|> the pad) as single tokens. ``initializer_range``:
    the weights' std; at the default 0.02 the next-token distribution hardly depends on the context."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if chat_template == "qwen2.5":
        tok = char_tokenizer(
            QWEN2_SPECIALS,
            pad_token="<|endoftext|>",
            eos_token="<|im_end|>",
            unk_token="<|endoftext|>",
            additional_special_tokens=QWEN2_SPECIALS[1:],
        )
        tok.chat_template = QWEN2_5_CHAT_TEMPLATE
    else:
        tok = char_tokenizer(["<pad>", "<eos>", "<unk>"], pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
        if chat_template:
            tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab_size or len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    Qwen2ForCausalLM(cfg).to(dtype or torch.float32).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_deberta_reward(path, chat_template: bool = False, vocab_size: int | None = None, dtype=None):
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    tok = word_tokenizer()
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    cfg = DebertaV2Config(
        vocab_size=vocab_size or len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        num_labels=1,
        type_vocab_size=0,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
    )
    DebertaV2ForSequenceClassification(cfg).to(dtype or torch.float32).save_pretrained(path)
    tok.save_pretrained(path)
    return path
