"""A real character-level Hugging Face tokenizer over the doubling vocabulary."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trl_ext.tasks.doubling.task import BOS, EOS, PAD, VOCAB


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, ids in the seed's order (P=0, S=1, E=2, ...).

    The pre-tokenizer isolates every character so WordLevel sees single characters;
    ``Fuse`` makes decode join them without spaces. There is deliberately no unknown
    token: an unknown character must be an error, never a silent UNK (see
    ``trl_ext.tasks.doubling.task.check_text`` for the message that names it).
    """
    core = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(VOCAB)}))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",  # prompts are left-padded for generation, as TRL expects
        model_max_length=128,
    )
