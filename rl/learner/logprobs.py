"""Per-token log-probs of sampled tokens under the policy being trained, at
the trained positions alone, in float32, with a group's shared prompt
computed once (rl.learner.data.shared_prefix)."""

from __future__ import annotations

from typing import Any

import torch

ENTROPY_ROWS = 256
"""Trained positions the entropy figure is measured at, at most (evenly
spaced, the sum scaled up): a diagnostic that cost a tenth of a step."""


def token_logprobs(
    model: Any,
    ids: torch.Tensor,
    attn: torch.Tensor,
    mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    prefix: int = 0,
) -> tuple[Any, Any, Any]:
    """(log-probs of tokens 1..T-1 given those before, the summed entropy
    where tokens are trained, the positions computed), of the distribution
    the tokens were sampled from: the logits divided by `temperature` (one
    for all rows, or one a row), as the engines' behaviour log-probs are
    (rl.engine).

    The vocabulary projection and softmax run only where a token is
    trained (each row's own positions, not every row at every position some
    row trains: 49k logits a position were most of a step's time and memory
    over prompts and padding). Elsewhere the log-probs are 0, and masked
    out. A log-prob is the token's logit less the log-sum-exp of its row, in
    float32 (no whole log-softmax is kept); the entropy is measured at
    ENTROPY_ROWS positions at most.

    `prefix`: every row begins with these tokens and trains none of them
    before position `prefix` (rl.learner.data.shared_prefix). They are
    computed once, for the first row, and every row's own tokens attend to
    that one copy: a group's prompt costs one pass instead of one a reply.
    The gradient reaching the prompt is the sum of every row's, as when
    each row computed it."""
    trained = mask[:, 1:] > 0  # the logits at position p predict token p + 1
    rows, cols = trained.nonzero(as_tuple=True)
    if rows.numel() == 0:  # nothing trained (a weight-0 pass): one position keeps the graph
        rows = torch.zeros(1, dtype=torch.long, device=ids.device)
        cols = torch.tensor([ids.shape[1] - 2], device=ids.device)
        prefix = 0
    logits = _logits_at(model, ids, attn, rows, cols, prefix)
    if isinstance(temperature, torch.Tensor) and bool((temperature == 1.0).all()):
        temperature = 1.0
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature.to(logits)[rows, None]
    elif temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, -1)
    picked = logits.gather(-1, ids[rows, cols + 1][:, None]).squeeze(-1) - lse
    logp = torch.zeros(ids.shape[0], ids.shape[1] - 1, device=ids.device).index_put((rows, cols), picked)
    with torch.no_grad():  # the policy's entropy where it sampled
        n = int(trained.sum())
        at = torch.arange(0, n, max(1, -(-n // ENTROPY_ROWS)), device=ids.device)
        sub = logits[at] - lse[at, None]
        entropy = -(sub.exp() * sub).sum() * (n / max(1, len(at)))
    return logp, entropy, cols.unique()


def _logits_at(
    model: Any, ids: torch.Tensor, attn: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, prefix: int = 0
) -> Any:
    """float32 logits at (row, position) pairs: the decoder's last hidden
    states there, through the output layer; the shared `prefix` (see
    token_logprobs) once, as a key-value cache that every row extends. A
    model whose parts cannot be found that way (or that transforms its
    logits, as a soft cap does) runs whole, its logits taken at those
    positions, and computes every row's prefix. So does a model under
    ZeRO-3: its weights are gathered by the engine's forward, and the output
    layer called apart from it trained the tied embeddings wrongly (every
    weight off by up to 2 x lr after one step, tests/test_learner.py)."""
    partitioned = getattr(model, "zero_optimization_partition_weights", lambda: False)()
    inner = getattr(model, "module", model)  # a DeepSpeed engine's model
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner  # peft: adapters stay in
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if partitioned or decoder is None or head is None or getattr(inner.config, "final_logit_softcapping", None):
        keep = cols.unique()
        out = model(input_ids=ids, attention_mask=attn, logits_to_keep=keep).logits
        return out[rows, torch.searchsorted(keep, cols)].float()
    if prefix <= 0:
        hidden = decoder(input_ids=ids, attention_mask=attn).last_hidden_state
        return head(hidden[rows, cols]).float()
    cache = decoder(input_ids=ids[:1, :prefix], use_cache=True).past_key_values
    cache.batch_repeat_interleave(ids.shape[0])  # a copy a row, each a view of one graph
    # right padding: every row's own tokens start at `prefix`, the positions the cache implies
    hidden = decoder(input_ids=ids[:, prefix:], attention_mask=attn, past_key_values=cache, use_cache=True)
    return head(hidden.last_hidden_state[rows, cols - prefix]).float()
