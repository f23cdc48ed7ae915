"""Where a verify step's draft logits come from (CPU, fp32, tiny-llama): the step's own logits
rows after its sampled rows (one lm_head pass; a mixed graph computes them too) when they fit in
max_num_seqs rows, else the lm_head over the hidden states of the drafts' tokens. Both give the
greedy continuation exactly, accepted and rejected drafts alike."""

from __future__ import annotations

import pytest

from executor_svc.worker.staged import Staged
from tests.executor.conftest import make_runner
from tests.executor.spec_decode.test_spec_chain import accept_then_reject, greedy


@pytest.mark.parametrize("packed", [False, True])  # the verify rows' columns packed into staging, as on CUDA
@pytest.mark.parametrize("max_num_seqs,expected_row", [(3, None), (8, 1)])
def test_draft_logits_from_either_path_give_the_greedy_continuation(model_dirs, max_num_seqs, expected_row, packed):
    runner = make_runner(model_dirs["tiny-llama"], num_kv_blocks=32, block_size=16, max_num_seqs=max_num_seqs)
    if packed:
        runner.verifier._staged = Staged(runner.verifier._staged.nbytes, runner.device, pack=True)
    prepare, seen = runner.verifier.prepare, []

    def spy(*args, **kwargs):
        rows = prepare(*args, **kwargs)
        seen.append(rows.logits_row)
        return rows

    runner.verifier.prepare = spy
    accept_then_reject(runner, greedy(runner, 12))
    assert seen == [expected_row, expected_row]  # 1 sampled row + 3 drafts: 4 logits rows
