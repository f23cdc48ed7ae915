"""The rejection rule of speculative decoding for rows without top-k / top-p, in plain torch:
the reference kernels/spec_reject.py is tested against (and the CPU path).

Per draft position m with logits l [V], draft d, temperature T, seed and position:
  - T <= 0 (greedy): a = argmax_j l_j (lowest index on ties); accepted = (a == d); recovered = a.
  - T > 0: s = l / max(T, 1e-5) (float32), p = softmax(s);
      accepted  = u < p_d, u = uniform_noise(seed ^ accept_key, position, 1)[0];
      recovered = argmax_{j != d}(s_j + g_j), g = -log(-log(uniform_noise(seed, position, V))).
The recovered token is a draw from p with d removed and renormalised (max(p - q, 0) for the
point-mass draft q): Gumbel-max over s_j + g_j ranks tokens exactly as over log p_j + g_j, so
this is the general path's rule (spec_decode/verify.py) without materialising p. Tokens are
distributed as the target's; the noise is the sampler's counter hash (kernels/reference.py),
replayable from (seed, position).
"""

from __future__ import annotations

import torch

from kernels.reference import uniform_noise


def rejection_sample_reference(
    logits: torch.Tensor,  # [M, V] float32 | bfloat16
    draft_ids: torch.Tensor,  # [M] int64, in [0, V), or -1: no draft
    temperature: torch.Tensor,  # [M] float32; <= 0 = greedy
    seeds: torch.Tensor,  # [M] int64
    positions: torch.Tensor,  # [M] int64: the drafted token's position
    accept_key: int,  # the acceptance uniforms' seeds are seeds ^ accept_key
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted [M] bool, recovered [M] int64). A row whose draft is -1 has none: it is not
    accepted and its recovered token is the sampler's draw (kernels.gumbel_sample's, bit for
    bit: nothing is removed); the verify tail asks so for each request's last token row."""
    logits = logits.float()
    greedy_ids = logits.argmax(dim=-1)
    scaled = logits / temperature.float().clamp_min(1e-5)[:, None]
    has_draft = draft_ids >= 0
    at_draft = draft_ids.clamp_min(0)[:, None]
    p_draft = torch.exp(scaled.gather(1, at_draft)[:, 0] - torch.logsumexp(scaled, dim=-1))
    u = uniform_noise(seeds ^ accept_key, positions, 1)[:, 0]
    gumbel = -torch.log(-torch.log(uniform_noise(seeds, positions, logits.shape[-1])))
    is_draft = torch.arange(logits.shape[-1], device=logits.device)[None, :] == draft_ids[:, None]
    score = (scaled + gumbel).masked_fill(is_draft, float("-inf"))
    random_rows = temperature > 0
    accepted = torch.where(random_rows, (u < p_draft) & has_draft, greedy_ids == draft_ids)
    return accepted, torch.where(random_rows, score.argmax(dim=-1), greedy_ids)
