"""One step: the runner, per-request rows, host/device buffers, step inputs, plan checks, graphs, timers."""
