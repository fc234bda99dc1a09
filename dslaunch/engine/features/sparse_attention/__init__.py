"""Block-sparse attention (DeepSpeed's ``deepspeed.ops.sparse_attention``, removed in 0.19):
``layouts.py`` (the SparsityConfig classes, DeepSpeed's make_layout exactly),
``block_attention.py`` (attention on the kept blocks only, forward and backward),
``modules.py`` (SparseSelfAttention, BertSparseSelfAttention, the config section -> layout),
``utils.py`` (SparseAttentionUtils). The public face is ``dslaunch/ops/sparse_attention``.
"""
