"""Sampling with a static KV cache and one decode step that a GPU replays as a CUDA graph.

``sample_responses`` (the loop) grows its cache by concatenation and reads ``done.all()`` back
every token, so on a GPU each token costs hundreds of kernel launches and a host sync. Here the
cache is allocated once, sized to the padded prompt plus the response; every decode step has the
same shapes and no value leaves the device, so ``torch.compile(mode="reduce-overhead")`` captures
the forward and the sampling as one CUDA graph. Batch sizes, prompt lengths and response lengths are
rounded up to a few buckets, and a cache that already holds a request is reused, so a run compiles a
handful of times, not every update (nor every turn of a multi-turn rollout, whose later turns have
fewer rows, longer prompts and what is left of the budget). On CPU the same code runs
eagerly and draws exactly as the loop does: a test holds the two token-for-token equal.
"""

from __future__ import annotations

import warnings

import torch

from trl_ext.data.sequences import positions_from_mask
from trl_ext.ppo.rollout.interface import SamplingOptions
from trl_ext.ppo.rollout.loop import CACHE_ARG, last_positions


def bucket(n: int) -> int:
    """A batch size ``n`` rounded up to one of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... (powers of two
    and three quarters of them): two sizes per doubling, and under a third of a bucket is padding."""
    power = 1 << max(0, n - 1).bit_length()  # the smallest power of two >= n
    three_quarters = power * 3 // 4
    return three_quarters if power >= 4 and n <= three_quarters else power


def padded_length(n: int) -> int:
    """A prompt or response length ``n`` rounded up to a power of two, at least 16: a new length is a compile."""
    return max(16, 1 << (n - 1).bit_length())


def pick_tokens(
    logits: torch.Tensor, noise: torch.Tensor | None, *, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """``(B, V)`` float logits and ``(B, V)`` Exp(1) noise -> ``(B,)`` tokens, with static shapes.

    The loop's draw: ``torch.multinomial(p, 1)`` is ``argmax(p / q)`` with ``q ~ Exp(1)`` drawn over
    the whole vocabulary (the Gumbel-max trick, PyTorch's own one-sample path), so given the same
    ``q`` both samplers pick the same token. Top-k keeps the k largest (``torch.topk``, sorted),
    top-p then works on those k only: the same distribution as filtering the whole vocabulary, for
    a sort of k values instead of V. ``temperature == 0`` is greedy and needs no noise.
    """
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k == 0 and top_p >= 1.0:
        return (torch.softmax(logits, dim=-1) / noise).argmax(-1)
    k = min(top_k, logits.shape[-1]) if top_k > 0 else logits.shape[-1]
    values, index = torch.topk(logits, k, dim=-1)
    if top_p < 1.0:
        probs = torch.softmax(values, dim=-1)
        mass_before = probs.cumsum(-1) - probs  # the top token always stays
        values = values.masked_fill(mass_before >= top_p, float("-inf"))
    choice = (torch.softmax(values, dim=-1) / noise.gather(-1, index)).argmax(-1, keepdim=True)
    return index.gather(-1, choice).squeeze(-1)


def decode_step(
    model,
    cache,
    tokens: torch.Tensor,
    done: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache_position: torch.Tensor,
    noise: torch.Tensor | None,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    eos_token_id: int,
    pad_token_id: int,
):
    """One token for every row: forward of the last ``tokens`` over the static cache, then the draw.
    Rows already ``done`` get pad. Returns ``(tokens, done)``; nothing is read back to the host."""
    logits = (
        model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{CACHE_ARG: cache},
            cache_position=cache_position,
            use_cache=True,
            logits_to_keep=1,
        )
        .logits[:, -1]
        .float()
    )
    return _next(
        logits,
        done,
        noise,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def _next(logits, done, noise, *, temperature, top_k, top_p, eos_token_id, pad_token_id):
    token = pick_tokens(logits, noise, temperature=temperature, top_k=top_k, top_p=top_p)
    token = torch.where(done, torch.full_like(token, pad_token_id), token)
    return token, done | (token == eos_token_id)


class StaticDecoder:
    """The decoder behind the ``static`` sampler (``StaticCacheSampler``): the contract of ``sample_responses``, for
    one policy over a run.

    It keeps a few static caches, each ``(batch, length)``, reused (zeroed) across rollouts so a
    captured graph keeps its addresses: a request takes the smallest cache that holds it (its batch
    bucket and its padded prompt plus its new tokens; a larger batch costs a decode step about what
    a smaller one does while the step is bound by kernel launches, and no more than the run's largest
    rollout already cost), else a new one for the largest batch so far and its prompt plus its new
    tokens rounded up to a power of two, and calls the model it is handed, so it decodes with the
    policy's own parameter tensors (a PEFT model's adapters included; under FSDP/ZeRO-3 the caller
    gathers them once around the call). ``compile``: compile the decode step, by default on CUDA
    only, with ``compile_options`` (default: ``mode="reduce-overhead"``, i.e. CUDA graphs, shapes fixed;
    not ``fullgraph``: past torch's limit of recompiles, 8 shape buckets and sampling settings, a
    full graph is a hard error, while without it a new shape decodes eagerly; a test checks that the
    step has no graph break). ``check_every``: read "has every row ended?" back every N tokens;
    default 1 on CPU (where it is free, and the generator then advances exactly as the loop's), 8 on CUDA.
    """

    def __init__(
        self,
        compile: bool | None = None,
        compile_options: dict | None = None,
        check_every: int | None = None,
        max_caches: int = 4,
    ):
        self.compile, self.check_every, self.max_caches = compile, check_every, max_caches
        self.compile_options = compile_options or {"mode": "reduce-overhead", "dynamic": False}
        self._caches: dict[tuple, object] = {}
        self._compiled = None

    def _step_function(self, on_cuda: bool):
        if not (self.compile if self.compile is not None else on_cuda):
            return decode_step
        if self._compiled is None:
            self._compiled = torch.compile(decode_step, **self.compile_options)
        return self._compiled

    def _shape(self, rows: int, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
        """The cache ``(batch, length)`` for ``rows`` rows: the smallest kept one that holds them, else a new
        one for the largest batch so far (a tool loop's later turns grow as the policy learns to call) and the
        prompt plus the new tokens rounded up to a power of two."""
        batch = bucket(rows)
        fitting = [key for key in self._caches if key[0] >= batch and key[1] >= prompt_len + max_new_tokens]
        if fitting:
            return min(fitting, key=lambda key: key[0] * key[1])
        return max([batch] + [key[0] for key in self._caches]), prompt_len + padded_length(max_new_tokens)

    def _cache(self, model, batch: int, length: int):
        from transformers import StaticCache

        key = (batch, length)
        cache = self._caches.pop(key, None)
        if cache is None:
            cache = StaticCache(config=model.config, max_cache_len=length)
            if len(self._caches) >= self.max_caches:  # the oldest goes: memory stays bounded
                self._caches.pop(next(iter(self._caches)))
        else:
            cache.reset()
        self._caches[key] = cache
        return cache

    @torch.no_grad()
    def __call__(self, model, query_ids, query_mask, options: SamplingOptions, generator=None) -> torch.Tensor:
        """``(B, R)`` sampled ids, pad after the first eos; ``R <= options.max_new_tokens`` (fewer when every
        row has ended by a check). Draws from ``generator`` as ``sample_responses`` does."""
        max_new_tokens, temperature, pad_token_id = options.max_new_tokens, options.temperature, options.pad_token_id
        # A PEFT model's base model carries the adapter layers: calling it skips PEFT's Python wrapper.
        decoder = model.get_base_model() if hasattr(model, "get_base_model") else model
        rows, prompt = query_ids.shape
        device, on_cuda = query_ids.device, query_ids.is_cuda
        # Prompts to a power of two (at least 16): a longer prompt costs one prefill, a new length a compile.
        prompt_len = padded_length(prompt)
        batch, length = self._shape(rows, prompt_len, max_new_tokens)
        # Extra rows repeat row 0 and start done; extra prompt columns are left padding.
        ids = torch.full((batch, prompt_len), pad_token_id, dtype=query_ids.dtype, device=device)
        mask = torch.zeros((batch, length), dtype=torch.long, device=device)
        ids[:rows, prompt_len - prompt :], ids[rows:, prompt_len - prompt :] = query_ids, query_ids[:1]
        mask[:rows, prompt_len - prompt : prompt_len] = query_mask
        mask[rows:, prompt_len - prompt : prompt_len] = query_mask[:1]
        mask[:, prompt_len:] = 1  # constant over the decode: the causal mask hides what is not written yet
        positions = positions_from_mask(mask[:, :prompt_len])
        cache = self._cache(decoder, batch, length)
        logits = (
            decoder(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                **{CACHE_ARG: cache},
                cache_position=torch.arange(prompt_len, device=device),
                use_cache=True,
                logits_to_keep=last_positions(prompt_len, 1, device),
            )
            .logits[:, -1]
            .float()
        )

        noise = None
        if temperature != 0:  # the extra rows draw nothing: the generator advances as the loop's
            noise = torch.ones_like(logits)
        done = torch.arange(batch, device=device) >= rows
        responses = torch.full((batch, max_new_tokens), pad_token_id, dtype=query_ids.dtype, device=device)
        step_options = {
            k: getattr(options, k) for k in ("temperature", "top_k", "top_p", "eos_token_id", "pad_token_id")
        }
        if noise is not None:
            noise[:rows].exponential_(generator=generator)
        tokens, done = _next(logits, done, noise, **step_options)
        responses[:, 0] = tokens
        step = self._step_function(on_cuda)
        check_every = self.check_every or (8 if on_cuda else 1)
        position_ids = positions[:, -1:] + 1
        cache_position = torch.full((1,), prompt_len, dtype=torch.long, device=device)
        steps = 1
        while steps < max_new_tokens:
            if steps % check_every == 0 and bool(done[:rows].all()):
                break
            if noise is not None:
                noise[:rows].exponential_(generator=generator)
            if on_cuda:  # the graph's outputs of the last replay were copied out: it may overwrite them
                torch.compiler.cudagraph_mark_step_begin()
            inputs = (decoder, cache, tokens, done, mask, position_ids, cache_position, noise)
            try:
                new_tokens, new_done = step(*inputs, **step_options)
            except torch.OutOfMemoryError:
                raise
            except Exception as error:  # a step that will not compile still decodes, eagerly and slower
                if step is decode_step:
                    raise
                warnings.warn(
                    f"static sampler: the compiled decode step failed ({type(error).__name__}: "
                    f"{str(error)[:300]}); decoding eagerly from now on",
                    stacklevel=2,
                )
                self.compile, step = False, decode_step
                new_tokens, new_done = step(*inputs, **step_options)  # the cache write it repeats is the same
            tokens, done = new_tokens.clone(), new_done.clone()
            responses[:, steps] = tokens
            position_ids.add_(1)
            cache_position.add_(1)
            steps += 1
        return responses[:rows, :steps]
