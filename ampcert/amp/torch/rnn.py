"""nn.RNN and nn.GRU on the CPU, re-run op by op for ampcert's autocast.

Why
---
``nn.RNN``/``nn.GRU`` call one C builtin (``torch._VF.rnn_tanh``, ``rnn_relu``,
``gru``). Native autocast never sees that builtin: on the CPU it is an ATen
composite (``_rnn_impl`` in ``aten/src/ATen/native/RNN.cpp``) whose inner
``linear`` calls autocast casts one by one, so the matmuls run in the
low-precision dtype and the rest follows by type promotion. A
``TorchFunctionMode`` sees only the builtin; run untouched it computes
everything in fp32. This module is that ATen composite written with torch
ops, in ATen's order, so that under ampcert's mode each ``F.linear`` (and
everything else) is decided by the policy, as native autocast decides it:

- per layer and direction, the input projection of the whole sequence first
  (``linear(x, w_ih, b_ih)``, ATen's CPU pre-computation), then per step
  ``linear(h, w_hh, b_hh)`` and the cell;
- RNN cell: ``tanh``/``relu`` of ``hh.add_(ih)``;
- GRU cell: ``r = hh_r.add_(ih_r).sigmoid_()``, ``z = hh_z.add_(ih_z).sigmoid_()``,
  ``n = ih_n.add(hh_n.mul_(r)).tanh_()``, ``h' = (h - n).mul_(z).add_(n)``;
- the reverse direction on the reversed steps, outputs reversed back and
  concatenated on the last dimension; dropout between layers when training.

Not covered (run untouched, fp32): packed sequences (``PackedSequence``
inputs reach the builtin with batch sizes), CUDA (cuDNN's fused kernels,
which native autocast casts as a whole), and ``nn.LSTM``, whose CPU path is
oneDNN's ``mkldnn_rnn_layer`` when the CPU has it and a composite otherwise:
which one native autocast meets depends on the CPU and on grad mode.

Imports torch and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["RNN_OPS", "decompose"]


#: One direction of one layer: (w_ih, w_hh, b_ih, b_hh), the biases None without them.
Weights = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]


def _rnn_tanh_cell(ih: torch.Tensor, h: torch.Tensor, w: Weights) -> torch.Tensor:
    return torch.tanh(F.linear(h, w[1], w[3]).add_(ih))


def _rnn_relu_cell(ih: torch.Tensor, h: torch.Tensor, w: Weights) -> torch.Tensor:
    return torch.relu(F.linear(h, w[1], w[3]).add_(ih))


def _gru_cell(ih: torch.Tensor, h: torch.Tensor, w: Weights) -> torch.Tensor:
    ih_r, ih_z, ih_n = ih.unsafe_chunk(3, 1)
    hh_r, hh_z, hh_n = F.linear(h, w[1], w[3]).unsafe_chunk(3, 1)
    reset = hh_r.add_(ih_r).sigmoid_()
    update = hh_z.add_(ih_z).sigmoid_()
    new = ih_n.add(hh_n.mul_(reset)).tanh_()
    return (h - new).mul_(update).add_(new)


Cell = Callable[[torch.Tensor, torch.Tensor, Weights], torch.Tensor]
RNN_OPS: dict[str, Cell] = {"rnn_tanh": _rnn_tanh_cell, "rnn_relu": _rnn_relu_cell, "gru": _gru_cell}


def _direction(cell: Cell, x: torch.Tensor, h: torch.Tensor, w: Weights,
               reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    steps = list(F.linear(x, w[0], w[2]).unbind(0))  # the whole sequence's input projection first
    if reverse:
        steps.reverse()
    outputs = []
    for ih in steps:
        h = cell(ih, h, w)
        outputs.append(h)
    if reverse:
        outputs.reverse()
    return torch.stack(outputs, 0), h


def decompose(op: str, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``torch._VF.<op>(input, hx, weights, has_biases, num_layers, dropout, train,
    bidirectional, batch_first)`` as torch ops, or None where this module does
    not cover the call (see the module doc): the caller then runs the builtin."""
    if kwargs or len(args) != 9:
        return None
    x, hx, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
    if not (isinstance(x, torch.Tensor) and isinstance(hx, torch.Tensor) and x.device.type == "cpu"):
        return None  # a packed sequence passes its batch sizes second; CUDA runs cuDNN
    per = 4 if has_biases else 2
    directions = 2 if bidirectional else 1
    if len(weights) != per * directions * num_layers:
        return None  # projections or another layout: leave it to the builtin
    cell = RNN_OPS[op]
    layer_input = x.transpose(0, 1) if batch_first else x
    hiddens = hx.unbind(0)
    finals: list[torch.Tensor] = []
    for layer in range(num_layers):
        outputs = []
        for d in range(directions):
            i = layer * directions + d
            mine = weights[i * per:(i + 1) * per]
            w: Weights = (mine[0], mine[1], mine[2], mine[3]) if has_biases else (mine[0], mine[1], None, None)
            out, h = _direction(cell, layer_input, hiddens[i], w, reverse=d == 1)
            outputs.append(out)
            finals.append(h)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, outputs[0].dim() - 1)
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = F.dropout(layer_input, dropout, training=True)
    hidden = torch.stack(finals, 0)  # (ATen stacks the hidden states before it transposes back)
    return (layer_input.transpose_(0, 1) if batch_first else layer_input), hidden
