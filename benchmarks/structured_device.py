"""The device side of structured outputs, timed on CUDA: a step's packed int32 bitmask copied
from pinned host memory and applied to the logits (-inf where a bit is 0), for batch sizes as
the executor would see them. A reference for the executor's masking, not the executor's code.

    python -m benchmarks.structured_device [--vocab 49152]
"""

from __future__ import annotations

import argparse
import json


def apply_mask(logits, mask, shifts) -> None:
    """logits [B, V] float, mask [B, ceil(V / 32)] int32 (llguidance's layout), in place."""
    bits = (mask.unsqueeze(-1) >> shifts) & 1  # [B, W, 32]
    allowed = bits.reshape(mask.shape[0], -1)[:, : logits.shape[1]].bool()
    logits.masked_fill_(~allowed, float("-inf"))


def time_masking(vocab: int = 49152, batches=(1, 8, 64, 256), iters: int = 200) -> dict:
    import torch

    out = {}
    words = (vocab + 31) // 32
    shifts = torch.arange(32, device="cuda", dtype=torch.int32)
    for b in batches:
        host = torch.randint(-(2**31), 2**31 - 1, (b, words), dtype=torch.int32).pin_memory()
        mask = torch.empty_like(host, device="cuda")
        logits = torch.randn(b, vocab, device="cuda")
        check = logits.clone()
        mask.copy_(host)
        apply_mask(check, mask, shifts)
        expect = torch.tensor([[(int(host[r, t // 32]) >> (t % 32)) & 1 for t in range(0, vocab, 997)]
                               for r in range(b)], device="cuda").bool()
        assert torch.equal(torch.isinf(check[:, ::997]), ~expect)
        start, copied, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        for _ in range(10):
            mask.copy_(host, non_blocking=True)
            apply_mask(logits, mask, shifts)
        torch.cuda.synchronize()
        copy_ms = apply_ms = 0.0
        for _ in range(iters):
            start.record()
            mask.copy_(host, non_blocking=True)
            copied.record()
            apply_mask(logits, mask, shifts)
            end.record()
            end.synchronize()
            copy_ms += start.elapsed_time(copied)
            apply_ms += copied.elapsed_time(end)
        out[b] = {"copy_us": round(copy_ms / iters * 1e3, 1), "apply_us": round(apply_ms / iters * 1e3, 1),
                  "mask_bytes": host.numel() * 4}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args(argv)
    result = time_masking(args.vocab)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
