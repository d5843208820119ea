"""A rollout engine: ``model.generate``, returning the log-probs it sampled each token with. The trainer measures
the gap to its own log-probs (``sampling/sampling_logp_difference/*``) and, with
``vllm_importance_sampling_correction``, weights the policy loss by it, as for vLLM.

    trl-ext ppo ... --sampler recipes/extensions/generate_with_logprobs.py:GenerateWithLogprobs
"""

import torch

from trl_ext.data.sequences import response_mask
from trl_ext.ppo.rollout.interface import Completions, Sampler
from trl_ext.ppo.rollout.samplers import SAMPLERS


@SAMPLERS.register("generate_with_logprobs")
class GenerateWithLogprobs(Sampler):
    returns_logprobs = True

    def sample(self, model, query_ids, query_mask, options, generator=None):
        greedy = options.temperature == 0
        sampling = (
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p}
        )
        out = model.generate(
            input_ids=query_ids,
            attention_mask=query_mask,
            max_new_tokens=options.max_new_tokens,
            eos_token_id=options.eos_token_id,
            pad_token_id=options.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
            **sampling,
        )
        ids = out.sequences[:, query_ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1).float() / (1.0 if greedy else options.temperature)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[..., None]).squeeze(-1)
        mask = response_mask(ids, options.eos_token_id)
        return Completions(ids.masked_fill(mask == 0, options.pad_token_id), logprobs * mask)
