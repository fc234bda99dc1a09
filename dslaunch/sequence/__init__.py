"""``dslaunch.sequence``, as ``deepspeed.sequence``: long-sequence layers (``layer``: Ulysses;
``tiled``: tiled MLP and logits + loss)."""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
