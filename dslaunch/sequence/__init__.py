"""``dslaunch.sequence``, as ``deepspeed.sequence``: long-sequence layers (``layer``: Ulysses;
``tiled``: tiled MLP and logits + loss)."""
