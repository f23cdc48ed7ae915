"""The step-plan protocol between the scheduler and the executor, in one place.

`domain` holds the domain objects both services build and read (plain dataclasses: no grpc, no
torch); `codec` is the only conversion between them and the `llmserve.executor.v1` messages.
Both services import this package and neither imports the other.
"""
