"""The reference of the verify scan (kernels/spec_verify.py): speculative decoding's per-row
accept scan, the row's final token, the chain flags and the rows' last tokens, in plain torch."""

from __future__ import annotations

import torch


def verify_scan_reference(
    accepted: torch.Tensor,  # [D] bool: draft j of the step accepted (each draft alone)
    recovered: torch.Tensor,  # [D] int64: the token drawn where draft j is rejected
    draft_ids: torch.Tensor,  # [D] int64
    draft_start: torch.Tensor,  # [S] int64: the row's first draft among the D
    num_drafts: torch.Tensor,  # [S] int64, >= 1
    rows: torch.Tensor,  # [S] int64 persistent rows, distinct
    last_tokens: torch.Tensor,  # [R] int64, in/out: the rows' last tokens (the bonus tokens in)
    chain_ok: torch.Tensor,  # [R] bool, in/out
    chained: torch.Tensor | None,  # [S] bool: the row's verify is void unless chain_ok[row]
    prev_last: torch.Tensor | None,  # [S] int64: a void row's last token (with chained)
    max_drafts: int,  # >= num_drafts.max()
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per verify row i (d drafts from draft_start[i]): n = its leading accepted drafts; its
    final token is recovered[start + n] if n < d, else its bonus last_tokens[rows[i]];
    tokens[i] = its n accepted drafts, then the final token, then zeros ([S, max_drafts + 1]).
    A chained row is valid iff chain_ok[row] (read before this step writes it); an invalid row's
    final token is prev_last[i] (tokens keep the scan's). Writes chain_ok[row] = (n == d and
    valid) and last_tokens[row] = final. Returns (tokens, n, final, valid or None)."""
    j = torch.arange(max_drafts, device=rows.device)
    inside = j[None, :] < num_drafts[:, None]
    idx = torch.where(inside, draft_start[:, None] + j[None, :], torch.zeros_like(j)[None, :])
    n = (accepted[idx] & inside).long().cumprod(dim=1).sum(dim=1)
    rejected_at = recovered[idx].gather(1, n.clamp(max=max_drafts - 1)[:, None])[:, 0]
    final = torch.where(n < num_drafts, rejected_at, last_tokens[rows])
    tokens = torch.zeros(len(rows), max_drafts + 1, dtype=torch.int64, device=rows.device)
    tokens[:, :max_drafts] = torch.where(j[None, :] < n[:, None], draft_ids[idx], 0)
    tokens.scatter_(1, n[:, None], final[:, None])
    full, valid = n == num_drafts, None
    if chained is not None:
        valid = ~chained | chain_ok[rows]
        full = full & valid
        final = torch.where(valid, final, prev_last)
    chain_ok.index_copy_(0, rows, full)
    last_tokens.index_copy_(0, rows, final)
    return tokens, n, final, valid


def verify_token_rows_reference(
    ids: torch.Tensor,  # [T] int64, in/out: each token row's token (greedy: its argmax)
    input_ids: torch.Tensor,  # [T] int64: each token's input (a request's drafts at its tokens 1..d)
    segments: torch.Tensor,  # [T] int32: (d << 1) | chained at a request's first token, < 0 elsewhere
    src_rows: torch.Tensor,  # [T] int64: each token's persistent row
    last_tokens: torch.Tensor,  # [R] int64, in/out
    chain_ok: torch.Tensor,  # [R] bool, in/out
    counts: torch.Tensor,  # [T] int64, out
) -> None:
    """A verify step laid out as token rows (one row per token, a request's tokens consecutive),
    in one pass: per request (a first token s with d drafts), n = its leading accepted drafts:
    draft j is accepted where it equals the token drawn before it (ids[s + j] == input_ids[s + j + 1]:
    the argmax, or the sampler's seeded draw). Its tokens are ids[s : s + n + 1] as they are: the
    accepted drafts, then ids[s + n], the token drawn where it stopped. A chained request is valid iff chain_ok[row] (read before this step
    writes it); writes chain_ok[row] = (valid and n == d), last_tokens[row] = ids[s + n] if valid
    (a void row keeps its last token), counts[s] = n + 1 if valid else 0 and counts = 0 at every
    other token."""
    counts.zero_()
    starts = torch.nonzero(segments >= 0)[:, 0]
    if not len(starts):
        return
    seg = segments[starts].long()
    d, chained = seg >> 1, (seg & 1).bool()
    j = torch.arange(max(int(d.max()), 1), device=ids.device)
    inside = j[None, :] < d[:, None]
    at = torch.where(inside, starts[:, None] + j[None, :], torch.zeros_like(j)[None, :])
    drafts = input_ids[torch.where(inside, at + 1, at)]
    n = ((ids[at] == drafts) & inside).long().cumprod(dim=1).sum(dim=1)
    rows = src_rows[starts]
    valid = ~chained | chain_ok[rows]
    chain_ok.index_copy_(0, rows, valid & (n == d))
    last_tokens.index_copy_(0, rows[valid], ids[starts + n][valid])
    counts.index_copy_(0, starts, torch.where(valid, n + 1, 0))
