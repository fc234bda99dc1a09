"""``dslaunch.ops``, as ``deepspeed.ops``: the optimizers under DeepSpeed's class names and
signatures, usable as plain torch optimizers outside the engine (``adam``: DeepSpeedCPUAdam,
FusedAdam; ``adagrad``: DeepSpeedCPUAdagrad; ``lion``: DeepSpeedCPULion, FusedLion; ``lamb``:
FusedLamb), ``op_builder``: DeepSpeed's builder classes over dslaunch's compiled ops
(``AsyncIOBuilder().load().aio_handle(...)``, loaded on first use), and ``sparse_attention``
(DeepSpeed 0.18's block-sparse attention, loaded on first use).

A face: the implementation is ``dslaunch/engine/optim/`` (``cpu_adam.py`` over the compiled ops
of ``dslaunch/kernels``, ``fused.py``, ``lamb.py``) and ``dslaunch/engine/features/sparse_attention/``.
"""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.ops import adagrad, adam, lamb, lion

__all__ = ["adam", "adagrad", "lion", "lamb"]

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
