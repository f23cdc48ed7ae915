"""`llmserve`: the one-command launcher that starts both services on one machine.

It belongs to neither service: it only starts `python -m executor_svc` and
`python -m scheduler_svc` as two processes (so it never imports torch itself) and supervises
them. Beside it, what the launcher and both services read alike, torch-free: the bearer-token
check (bearer_auth.py), `--speculative-config` (speculative.py), the LLMSERVE_<SERVICE>_<FLAG>
fallbacks (env.py), the log format (logs.py) and the per-request limits (limits.py).
"""
