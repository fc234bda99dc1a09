"""``RandomLayerTokenDrop``: a layer wrapper that, in training, runs the layer on the kept tokens
only (DeepSpeed 0.19.8's class, based on the random-LTD paper, arXiv 2211.11586).

Until the engine binds it (``init_config``) it is the layer itself. Bound, each training forward
reads the kept length from the scheduler; when it is below the sequence length, the wrapper with
id 0 draws the kept positions for all the dropping layers of this forward (and cuts the mask),
the others reuse them; the layer sees only its kept tokens and the others leave it unchanged.
Evaluation forwards, and kept lengths at or above the sequence length, run the whole sequence.
"""

from __future__ import annotations

import inspect

from torch import Tensor
from torch.nn import Module

from dslaunch.engine.features.random_ltd.scheduler import ATTENTION_MASK, MAX_VALUE, SAMPLE_INDEX
from dslaunch.engine.features.random_ltd.tokens import (
    bert_sample_tokens,
    gather_tokens,
    gpt_sample_tokens,
    scatter_tokens,
)

KEY = "data_efficiency.data_routing.random_ltd"
HIDDEN_STATE_ORDERS = {"batch_seq_dim": True, "seq_batch_dim": False}  # -> batch first
MODEL_TYPES = {"encoder": bert_sample_tokens, "decoder": gpt_sample_tokens}


class RandomLayerTokenDrop(Module):
    def __init__(self, layer: Module):
        super().__init__()
        self.random_ltd_layer = layer
        self.random_ltd_scheduler = None
        self.max_length = None
        self.reserved_length = -1
        self.curr_seq = -1
        self.curr_micro_batch = -1
        self.batch_first = False

    def init_config(self, config: dict, scheduler, random_ltd_layer_id: int) -> None:
        """Bind to ``scheduler``; ``random_ltd_layer_id``: this layer's place among the dropping
        layers (0 draws the positions for all of them)."""
        order, model_type = config["hidden_state_order"], config["model_type"]
        if order not in HIDDEN_STATE_ORDERS:
            raise ValueError(f"{KEY}.hidden_state_order: {order!r}; use one of "
                             f"{sorted(HIDDEN_STATE_ORDERS)}")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"{KEY}.model_type: {model_type!r}; use one of {sorted(MODEL_TYPES)}")
        self.random_ltd_scheduler = scheduler
        self.random_ltd_layer_id = random_ltd_layer_id
        self.max_length = scheduler.state[MAX_VALUE]
        self.mask_name = config.get("model_mask_name")
        self.micro_bs = config.get("micro_batch_size")
        self.random_ltd_num_layer = scheduler.random_ltd_layer_num
        self.batch_first = HIDDEN_STATE_ORDERS[order]
        self.model_type = model_type
        self.index_generator = MODEL_TYPES[model_type]

    def _mask_position(self):
        """Where the mask arrives among the positional arguments after the hidden states, or None
        (Transformers 5's GPT-2 passes it positionally; DeepSpeed only reads the keyword)."""
        if not hasattr(self, "_mask_pos"):
            try:
                names = list(inspect.signature(self.random_ltd_layer.forward).parameters)
            except (TypeError, ValueError):
                names = []
            self._mask_pos = (names.index(self.mask_name) - 1
                              if self.mask_name in names[1:] else None)
        return self._mask_pos

    def _read_shape(self, hidden: Tensor) -> None:
        seq_dim, batch_dim = (1, 0) if self.batch_first else (0, 1)
        self.curr_seq, self.curr_micro_batch = hidden.size(seq_dim), hidden.size(batch_dim)

    def forward(self, hidden_states: Tensor, *args, **kwargs):
        sched = self.random_ltd_scheduler
        if sched is not None:
            self.reserved_length = sched.get_current_seq()
            self._read_shape(hidden_states)
        if not (self.training and sched is not None and self.reserved_length < self.curr_seq):
            return self.random_ltd_layer(hidden_states, *args, **kwargs)
        args = list(args)
        pos = self._mask_position() if self.mask_name is not None else None
        positional = self.mask_name not in kwargs and pos is not None and pos < len(args)
        if self.random_ltd_layer_id == 0:  # one draw per forward, shared by the dropping layers
            mask = None
            if self.mask_name is not None:
                mask = args[pos] if positional else kwargs.get(self.mask_name)
            indices, part_mask = self.index_generator(
                self.reserved_length, self.curr_seq, self.curr_micro_batch,
                self.random_ltd_num_layer, hidden_states.device, mask)
            sched.state[SAMPLE_INDEX], sched.state[ATTENTION_MASK] = indices, part_mask
        else:
            indices, part_mask = sched.state[SAMPLE_INDEX], sched.state[ATTENTION_MASK]
        mine = indices[self.random_ltd_layer_id]
        if self.mask_name is not None:
            cut = part_mask[self.random_ltd_layer_id] if self.model_type == "encoder" else part_mask
            if positional:
                args[pos] = cut
            else:
                kwargs[self.mask_name] = cut
        outputs = self.random_ltd_layer(gather_tokens(hidden_states, mine, self.batch_first),
                                        *args, **kwargs)
        if isinstance(outputs, Tensor):
            return scatter_tokens(hidden_states, outputs, mine, self.batch_first)
        if isinstance(outputs, tuple):
            return (scatter_tokens(hidden_states, outputs[0], mine, self.batch_first),
                    *outputs[1:])
        raise TypeError(f"random-LTD: {type(self.random_ltd_layer).__name__} returned "
                        f"{type(outputs).__name__}; a dropping layer must return a tensor or a "
                        "tuple whose first item is the hidden states")
