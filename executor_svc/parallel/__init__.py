"""Tensor parallelism over torch.distributed (--tensor-parallel-size N): the process-group
state (state.py), the vocabulary-parallel embedding and logits (layers.py), the checkpoint
sharding (shard.py), and the ranks of one executor (launch.py, ranks.py, worker.py, channel.py)."""
