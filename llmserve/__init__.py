"""`llmserve`: the one-command launcher that starts both services on one machine.

It belongs to neither service: it only starts `python -m executor_svc` and
`python -m scheduler_svc` as two processes (so it never imports torch itself) and supervises
them.
"""
