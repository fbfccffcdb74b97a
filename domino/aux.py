"""The aux-layer convention: which verifier states the drafter reads, and how they are taken.

Aux-layer ids follow speculators and vLLM: id ``i`` is the input of decoder layer ``i``, that
is, 0 is the embedding output, ``i`` the output of decoder layer ``i - 1``, and ``L`` (the
verifier's depth) the last layer's output *before* the final norm, which is what vLLM captures
when it extracts or serves. z-lab/dflash and SpecForge count one higher (their ``i`` is our
``i - 1``). transformers' ``hidden_states[i]`` agrees for ``i < L`` but puts the normed state
at ``L``.

``AuxCapture`` takes the states with forward hooks on exactly the modules whose outputs the ids
name (the embedding for 0, decoder layer ``i - 1`` for ``i``), so a forward needs no
``output_hidden_states`` and keeps nothing else. Training (``domino.features``), decoding
(``domino.decode``) and the tests all take aux states through it, so the convention is stated
here once. Torch only: a decoding process needs nothing of the tokenizer or the loading code.
"""

from __future__ import annotations

import torch


class AuxCapture:
    """The aux states of the latest verifier forward, concatenated in the order of ``layer_ids``.

    Use: ``with AuxCapture(verifier, ids) as cap: verifier(...)`` then ``cap.aux()`` ->
    (batch, seq, len(ids) * H). The hooks live only inside the with-block.
    """

    def __init__(self, verifier, layer_ids):
        self.layer_ids = list(layer_ids)
        model = verifier.model
        # the module whose output each id names, and each module once
        self._source = {i: model.embed_tokens if i == 0 else model.layers[i - 1] for i in self.layer_ids}
        self._modules = list({id(m): m for m in self._source.values()}.values())
        self._out: dict[int, torch.Tensor] = {}
        self._handles = []

    def _keeper(self, module):
        def keep(mod, args, output):
            self._out[id(module)] = output[0] if isinstance(output, tuple) else output
        return keep

    def __enter__(self):
        self._handles = [m.register_forward_hook(self._keeper(m)) for m in self._modules]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def aux(self) -> torch.Tensor:
        """The latest forward's states: (batch, seq, len(ids) * H)."""
        if len(self._out) < len(self._modules):
            raise RuntimeError("AuxCapture.aux called before a verifier forward inside its with-block")
        return torch.cat([self._out[id(self._source[i])] for i in self.layer_ids], dim=-1)


@torch.no_grad()
def aux_states(verifier, input_ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """The aux states of ``input_ids`` (batch, seq) in one forward: (batch, seq, len(ids) * H)."""
    with AuxCapture(verifier, layer_ids) as cap:
        verifier.model(input_ids=input_ids)
    return cap.aux()
