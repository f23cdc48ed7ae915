"""The text of a step's outputs, off the step loop's critical path.

A row that simply continues (no stop string that could end it, no stop token, not at its
length, no logprobs) needs its text for the client only, never for the next plan: applying
its token (logprobs.fast_token_output) leaves `new_text` empty and records the row here, and
`fill` runs the detokenizers once the next plan has gone to the executor
(engine/step_loop.py), or at once when the caller does not defer (Scheduler.update_from_output
with defer_text False). A row whose text can end it (stop strings, its last token) is
detokenized while the step is applied, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .outputs import RequestOutput


class DeferredText:
    """Outputs whose new_text is still to be decoded, in the order they were applied."""

    def __init__(self) -> None:
        self._outputs: list[RequestOutput] = []
        self._detokenizers: list[Any] = []  # the row's incremental detokenizer (step(token) -> str)

    def __bool__(self) -> bool:
        return bool(self._outputs)

    def add(self, output: RequestOutput, detokenizer: Any) -> None:
        """output's one new token still needs its text from detokenizer."""
        self._outputs.append(output)
        self._detokenizers.append(detokenizer)

    def fill(self, on_failed: Callable[[int, Exception], None]) -> set[int]:
        """Decodes every recorded row's token into its output's new_text. A detokenizer that
        raises fails its request alone (on_failed(req_id, exception)); returns those ids, whose
        outputs must not go out."""
        outputs, detokenizers = self._outputs, self._detokenizers
        self._outputs, self._detokenizers = [], []
        failed: set[int] = set()
        for out, detokenizer in zip(outputs, detokenizers):
            try:
                out.new_text = detokenizer.step(out.new_token_ids[0])
            except Exception as e:  # noqa: BLE001 - its own text: it fails alone (docs/hardening.md)
                failed.add(out.req_id)
                on_failed(out.req_id, e)
        return failed
