"""--persistent-decode (kernels/persistent_decode.py through models/persistent.py): a decode step of
1..8 rows in one launch gives the model's own hidden states and writes the same k and v into every
layer's cache, touching no other cache row. Staged (a launch a stage, the Triton interpreter on CPU
in float32; CUDA in bfloat16) against the model's regular path; on CUDA the persistent launch (one
launch, a grid barrier between stages) is bit for bit its staged launches, at the SM count and
with 3 programs (many items each), with two weight tiles in flight and with large tiles summed
a tile at a time (`TILED`), and leaves its barrier counters at zero; more programs than
the SMs hold at once are refused before the launch. Models outside its
scope are refused with the reason."""

from __future__ import annotations

import pytest
import torch

from executor_svc.model_loader.safetensors import load_model
from executor_svc.models.persistent import PersistentDecode
from executor_svc.startup.kv_cache import allocate_kv_caches
from tests.executor.models.test_batch_invariant_model import BLOCK, _meta
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS

DTYPE = torch.bfloat16 if ON_CUDA else torch.float32
ARCHS = ["tiny-llama"] + (["demo"] if ON_CUDA else [])
ROWS = [1, 3, 8] if ON_CUDA else [1, 3]
# (blocks, prompt length) of up to 8 requests: contexts across block boundaries
REQUESTS = [([1, 2, 3], 20), ([4, 5], 13), ([6], 1), ([7, 8], 16), ([9, 10, 11], 33), ([12], 7),
            ([13, 14], 17), ([15, 16, 17], 40)]
# large weight tiles (K tiles from a tile's bytes: here small, several a GEMV), each summed over K at
# once, two in flight, up to 64 columns an item; the context in 3 attention splits of 16-token tiles,
# merged by each (row, kv head)'s last split: other bits than the default launch, the same tolerance
TILED = dict(block_k=None, tile_bytes=64, max_block_n=64, reduce_each=True, prefetch=True, num_splits=3,
             attention_block_n=16)


def triton_test(fn):
    for mark in TRITON_MARKS:
        fn = mark(fn)
    return fn


@pytest.fixture(scope="module")
def demo_dirs(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_random_model

    base = tmp_path_factory.mktemp("persistent")
    return {name: build_random_model(base / name, name) for name in ARCHS}


def _prefilled(model, rows: int):
    """Caches holding `rows` requests' prompts (the regular path), and the decode step after them."""
    caches = allocate_kv_caches(model.args, 48, BLOCK, DTYPE, torch.device(DEVICE))
    gen = torch.Generator().manual_seed(rows)
    with torch.inference_mode():
        for blocks, n in REQUESTS[:rows]:
            meta, pos = _meta([(blocks, 0, n)], DEVICE)
            model(torch.randint(0, model.args.vocab_size, (n,), generator=gen).to(DEVICE), pos, meta, caches)
    step, positions = _meta([(blocks, n, 1) for blocks, n in REQUESTS[:rows]], DEVICE)
    ids = torch.randint(0, model.args.vocab_size, (rows,), generator=gen).to(DEVICE)
    return caches, step, positions, ids


def _clone(caches):
    return [c._replace(k=c.k.clone(), v=c.v.clone()) for c in caches]


@triton_test
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("arch", ARCHS)
def test_one_launch_gives_the_model_s_hidden_states_and_cache(arch, rows, demo_dirs):
    model = load_model(demo_dirs[arch], DEVICE, DTYPE)
    caches, step, positions, ids = _prefilled(model, rows)
    before = _clone(caches)
    persistent = PersistentDecode(model)
    assert persistent.applies(ids, step, caches)
    ours_caches = _clone(caches)
    with torch.inference_mode():
        want = model(ids, positions, step, caches)  # model.persistent is None: the regular path
        got = persistent(ids, positions, step, ours_caches, staged=True)
    with torch.inference_mode():  # two weight tiles in flight: the same products in the same order
        plain, pre = (persistent(ids, positions, step, _clone(caches), staged=True, prefetch=p, block_k=16)
                      for p in (False, True))  # 16-wide K tiles: several a GEMV
        assert torch.equal(plain, pre)
        tiled = persistent(ids, positions, step, _clone(caches), staged=True, **TILED)
        merge_stage = persistent(ids, positions, step, _clone(caches), staged=True, **TILED, merge_last=False)
        assert torch.equal(tiled, merge_stage)  # the same merge, in the split or in a stage of its own
    tol = 3e-2 if ON_CUDA else 1e-4
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol), (got - want).abs().max()
    assert torch.allclose(tiled.float(), want.float(), rtol=tol, atol=tol), (tiled - want).abs().max()
    written = step.slot_mapping
    for new, ref, old in zip(ours_caches, caches, before):
        for ours, theirs, prev in ((new.k, ref.k, old.k), (new.v, ref.v, old.v)):
            flat, flat_ref, flat_old = (t.flatten(0, 1) for t in (ours, theirs, prev))
            assert torch.allclose(flat[written].float(), flat_ref[written].float(), rtol=tol, atol=tol)
            keep = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
            keep[written] = False
            assert torch.equal(flat[keep], flat_old[keep])  # no other row touched
    if ON_CUDA:  # the persistent launch is its staged launches, bit for bit
        for programs, launch, staged in ((None, {}, got), (3, {}, got), (None, dict(prefetch=True), got),
                                         (None, TILED, tiled), (5, TILED, tiled)):
            again = _clone(caches)
            with torch.inference_mode():
                one = persistent(ids, positions, step, again, num_programs=programs, **launch)
            torch.cuda.synchronize()
            assert torch.equal(one, staged), (programs, launch)
            if staged is got:
                assert all(torch.equal(a.k, b.k) and torch.equal(a.v, b.v) for a, b in zip(again, ours_caches))
            assert not persistent.barrier.any()  # every counter back to zero
        m = persistent.model  # more programs than the SMs hold at once would never pass a barrier: refused
        with pytest.raises(ValueError, match="do not fit"):
            persistent.kernel.persistent_decode_triton(
                ids, positions, step.slot_mapping, step.block_tables, step.seq_lens, m.embed_tokens.weight,
                persistent.table(again), m.norm.weight, m.cos_sin_cache, again[0].k, persistent.shape,
                m.args.rms_norm_eps, persistent.barrier, programs_per_sm=16)


@pytest.mark.parametrize("arch,reason", [("tiny-qwen2", "qkv bias"), ("tiny-qwen3", "q/k norm"),
                                         ("tiny-mistral", "sliding-window")])
def test_models_outside_its_scope_are_refused_with_the_reason(arch, reason, model_dirs):
    model = load_model(model_dirs[arch], "cpu", torch.float32)
    with pytest.raises(ValueError, match=reason):
        PersistentDecode(model)
