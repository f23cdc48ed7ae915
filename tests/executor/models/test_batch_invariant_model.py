"""--deterministic on the model (models/llama.py, batch_invariant=True): a sequence's logits are
bit for bit the same computed as one prefill, as a chunked prefill (chunks of 3, 16, 17 and
32 tokens), token by token as decode
steps, and beside other requests in mixed and decode steps; and they stay close to the default
mode's. Every architecture (tiny-mistral: a sliding window). CPU float32 always; CUDA bfloat16
where there is a GPU (the Triton kernels: kernels/gemm_invariant.py, attention_prefill.py)."""

from __future__ import annotations

import pytest
import torch

from executor_svc.model_loader.safetensors import load_model
from executor_svc.models.attention import AttentionMetadata
from executor_svc.startup.kv_cache import allocate_kv_caches
from tests.executor.conftest import ARCHS

BLOCK = 16
SEQ = 40
DEVICES = [("cpu", torch.float32), pytest.param("cuda", torch.bfloat16, marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def _meta(requests, device):
    """requests: (block_ids, first position, number of new tokens) each -> metadata of one step."""
    width = max(len(r[0]) for r in requests)
    table = torch.zeros(len(requests), width, dtype=torch.int32)
    slots, positions, qsl, lens = [], [], [0], []
    for i, (blocks, start, n) in enumerate(requests):
        table[i, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        pos = torch.arange(start, start + n)
        slots.append(table[i, pos // BLOCK].long() * BLOCK + pos % BLOCK)
        positions.append(pos)
        qsl.append(qsl[-1] + n)
        lens.append(start + n)
    n_max = max(r[2] for r in requests)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots).to(device), block_tables=table.to(device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        max_query_len=n_max, max_seq_len=max(lens), is_decode=n_max == 1)
    return meta, torch.cat(positions).to(device)


class Runner:
    def __init__(self, model, dtype, device):
        self.model, self.device = model, device
        self.caches = allocate_kv_caches(model.args, 16, BLOCK, dtype, torch.device(device))

    def step(self, requests, ids):
        """ids: every request's new tokens back to back -> their logits [T, V]."""
        meta, positions = _meta(requests, self.device)
        with torch.inference_mode():
            return self.model.compute_logits(self.model(ids.to(self.device), positions, meta, self.caches))


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("arch", ARCHS)
def test_a_sequence_has_the_same_logits_however_it_is_batched(arch, device, dtype, model_dirs):
    model = load_model(model_dirs[arch], device, dtype, batch_invariant=True)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.args.vocab_size, (SEQ,), generator=gen)
    other = torch.randint(0, model.args.vocab_size, (SEQ,), generator=gen)
    a, b = [1, 2, 3], [4, 5, 6]  # the blocks of the sequence and of another request

    whole = Runner(model, dtype, device).step([(a, 0, SEQ)], ids)

    for size in (3, 16, 17, 32):  # chunked prefill at several chunk sizes (a block's, and across blocks)
        r = Runner(model, dtype, device)
        chunked = torch.cat([r.step([(a, p, min(size, SEQ - p))], ids[p:p + size]) for p in range(0, SEQ, size)])
        assert torch.equal(chunked, whole), size

    r = Runner(model, dtype, device)  # prefill of 30, then decode steps, beside another request's
    r.step([(b, 0, 25)], other[:25])
    steps = [r.step([(a, 0, 30)], ids[:30])]
    for p in range(30, SEQ):  # alone at even positions, beside the other request's decode at odd ones
        q = 25 + p - 30
        if p % 2:
            steps.append(r.step([(a, p, 1), (b, q, 1)], torch.cat([ids[p:p + 1], other[q:q + 1]]))[:1])
        else:
            steps.append(r.step([(a, p, 1)], ids[p:p + 1]))
    assert torch.equal(torch.cat(steps), whole)

    r = Runner(model, dtype, device)  # one mixed step: the whole prefill beside another prefill
    mixed = r.step([(b, 0, 23), (a, 0, SEQ)], torch.cat([other[:23], ids]))
    assert torch.equal(mixed[23:], whole)

    default = load_model(model_dirs[arch], device, dtype)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(whole, Runner(default, dtype, device).step([(a, 0, SEQ)], ids), atol=tol, rtol=tol)


def test_the_model_refuses_what_it_cannot_make_invariant():
    from executor_svc.models.llama import LlamaForCausalLM

    with pytest.raises(ValueError, match="skinny_max_tokens 0"):  # before the shape is read
        LlamaForCausalLM(None, skinny_max_tokens=1, batch_invariant=True)


def test_fp8_weights_are_refused_in_deterministic_mode(model_dirs):
    from executor_svc.model_loader.checks import ModelError

    with pytest.raises(ModelError, match="--deterministic serves unquantized weights only"):
        load_model(model_dirs["tiny-llama"], "cpu", torch.float32, quantization="fp8", batch_invariant=True)
