"""The aux-layer convention: which verifier states the drafter reads, and how they are taken.

Aux-layer ids follow speculators and vLLM: id ``i`` is the input of decoder layer ``i``, that
is, 0 is the embedding output, ``i`` the output of decoder layer ``i - 1``, and ``L`` (the
verifier's depth) the last layer's output *before* the final norm, which is what vLLM captures
when it extracts or serves. z-lab/dflash and SpecForge count one higher (their ``i`` is our
``i - 1``). transformers' ``hidden_states[i]`` agrees for ``i < L`` but puts the normed state
at ``L``.

``AuxCapture`` takes the states with forward hooks on exactly the modules whose states the ids
name (the input of the first decoder layer for 0, which is the embedding output, scaled where the
family scales it (Gemma) and with the learned positions added where it adds them (GPT-2); the
output of decoder layer ``i - 1`` for ``i``), so a forward needs no
``output_hidden_states`` and keeps nothing else. Training (``domino.data.features``), decoding
(``domino.decode``) and the tests all take aux states through it, so the convention is stated
here once. Torch only: a decoding process needs nothing of the tokenizer or the loading code.
"""

from __future__ import annotations

import torch

# the decoder's parts under the base model, by the names the verifier families give them
# (``domino.verifier.families``): the embedding, the decoder layers, the final norm (RMSNorm or LayerNorm)
from .verifier.families import EMBEDDINGS, FINAL_NORMS, LAYERS


def decoder_parts(model) -> dict:
    """The decoder's parts of a loaded causal LM: ``base`` (the model without its head:
    ``model``, GPT-2's ``transformer``, GPT-NeoX's ``gpt_neox``), ``embed``, ``layers`` and
    ``norm`` (the final norm), each None where not found by the families' names."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        base = getattr(model, "model", None)

    def first(names):
        return next((getattr(base, n) for n in names if getattr(base, n, None) is not None), None)

    return {"base": base, "embed": first(EMBEDDINGS), "layers": first(LAYERS), "norm": first(FINAL_NORMS)}


class AuxCapture:
    """The aux states of the latest verifier forward, concatenated in the order of ``layer_ids``.

    Use: ``with AuxCapture(verifier, ids) as cap: verifier(...)`` then ``cap.aux()`` ->
    (batch, seq, len(ids) * H). The hooks live only inside the with-block.
    """

    def __init__(self, verifier, layer_ids):
        self.layer_ids = list(layer_ids)
        layers = decoder_parts(verifier)["layers"]  # model.layers, GPT-2's transformer.h, ...
        # where each id's state is taken: the input of layer 0 for id 0, else the output of layer i - 1;
        # each (layer, side) once
        self._source = {i: (0, "in") if i == 0 else (i - 1, "out") for i in self.layer_ids}
        self._layers = layers
        self._taps = sorted(set(self._source.values()))
        self._out: dict[tuple, torch.Tensor] = {}
        self._handles = []

    def _keeper(self, tap):
        def keep_output(mod, args, output):
            self._out[tap] = output[0] if isinstance(output, tuple) else output

        def keep_input(mod, args, kwargs):
            self._out[tap] = args[0] if args else kwargs["hidden_states"]

        return keep_input if tap[1] == "in" else keep_output

    def __enter__(self):
        self._handles = [self._layers[i].register_forward_pre_hook(self._keeper((i, side)), with_kwargs=True)
                         if side == "in" else self._layers[i].register_forward_hook(self._keeper((i, side)))
                         for i, side in self._taps]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def aux(self) -> torch.Tensor:
        """The latest forward's states: (batch, seq, len(ids) * H)."""
        if len(self._out) < len(self._taps):
            raise RuntimeError("AuxCapture.aux called before a verifier forward inside its with-block")
        return torch.cat([self._out[self._source[i]] for i in self.layer_ids], dim=-1)


@torch.no_grad()
def aux_states(verifier, input_ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """The aux states of ``input_ids`` (batch, seq) in one forward: (batch, seq, len(ids) * H)."""
    with AuxCapture(verifier, layer_ids) as cap:
        verifier.base_model(input_ids=input_ids)
    return cap.aux()
