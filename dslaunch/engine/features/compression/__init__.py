"""Compression training (DeepSpeed 0.18's ``deepspeed.compression``; 0.19 removed it): weight
and activation quantization and sparse / row / head pruning through ``LinearLayer_Compress``,
channel pruning of ``nn.Conv2d`` (``conv.py``), stepped by ``compression_scheduler``;
``redundancy_clean`` makes it permanent and shrinks the model; layer reduction initialises a
student from a teacher's layers. The ``compression_training`` section is typed in
``dslaunch/config/compression.py``.
"""

from dslaunch.engine.features.compression.compress import init_compression, redundancy_clean
from dslaunch.engine.features.compression.conv import BNLayer_Compress, Conv2dLayer_Compress
from dslaunch.engine.features.compression.layers import LinearLayer_Compress
from dslaunch.engine.features.compression.quantize import quantize, topk_mask
from dslaunch.engine.features.compression.scheduler import compression_scheduler, scheduled_bits

__all__ = ["init_compression", "redundancy_clean", "LinearLayer_Compress", "Conv2dLayer_Compress",
           "BNLayer_Compress", "compression_scheduler",
           "scheduled_bits", "quantize", "topk_mask"]
