"""The aux-layer convention: which verifier states the drafter reads, and how they are taken.

Aux-layer ids follow speculators and vLLM: id ``i`` is the input of decoder layer ``i``, that
is, 0 is the embedding output, ``i`` the output of decoder layer ``i - 1``, and ``L`` (the
verifier's depth) the last layer's output *before* the final norm, which is what vLLM captures
when it extracts or serves. z-lab/dflash and SpecForge count one higher (their ``i`` is our
``i - 1``). transformers' ``hidden_states[i]`` agrees for ``i < L`` but puts the normed state
at ``L``, so when ``L`` is asked for, a forward hook on the last layer keeps its raw output.

Training (``domino.features``), decoding (``domino.decode``) and the tests all take aux states
through ``AuxCapture``, so the convention is stated here once. Torch only: a decoding process
needs nothing of the tokenizer or the loading code.
"""

from __future__ import annotations

import torch


class AuxCapture:
    """The aux states of one verifier forward, concatenated in the order of ``layer_ids``.

    Use: ``with AuxCapture(verifier, ids) as cap: out = verifier(..., output_hidden_states=True)``
    then ``cap.aux(out.hidden_states)`` -> (batch, seq, len(ids) * H).
    """

    def __init__(self, verifier, layer_ids):
        self.layer_ids = list(layer_ids)
        self.L = verifier.config.num_hidden_layers
        self._layer = verifier.model.layers[-1] if self.L in self.layer_ids else None
        self._handle, self._last = None, None

    def _keep(self, module, args, output):
        self._last = output[0] if isinstance(output, tuple) else output

    def __enter__(self):
        if self._layer is not None:
            self._handle = self._layer.register_forward_hook(self._keep)
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            self._handle.remove()
        self._handle = None

    def aux(self, hidden_states) -> torch.Tensor:
        """``hidden_states`` (transformers' tuple of (batch, seq, H)) -> (batch, seq, len(ids) * H)."""
        if self._layer is not None and self._last is None:
            raise RuntimeError("AuxCapture.aux called before a verifier forward inside its with-block")
        return torch.cat([self._last if i == self.L else hidden_states[i] for i in self.layer_ids], dim=-1)


@torch.no_grad()
def aux_states(verifier, input_ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """The aux states of ``input_ids`` (batch, seq) in one forward: (batch, seq, len(ids) * H)."""
    with AuxCapture(verifier, layer_ids) as cap:
        out = verifier.model(input_ids=input_ids, output_hidden_states=True)
    return cap.aux(out.hidden_states)
