import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tiny_verifier(seed=0, vocab=96, layers=4, hidden=64, dtype=torch.float64, max_pos=512):
    """A random Qwen3ForCausalLM small enough for CPU tests (float64 so greedy ties cannot flip)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_pos,
        tie_word_embeddings=False, initializer_range=0.3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = Qwen3ForCausalLM(cfg).to(dtype).eval()
    return model


def tiny_drafter(verifier, projector="domino", shift_label=True, correct_from=1, block_size=4,
                 draft_vocab=64, seed=1, attn="eager", mask_token_id=None):
    from domino.model import Drafter, DrafterConfig
    from domino.vocab import mappings

    V = verifier.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(V - 1, generator=g)[: draft_vocab]).values  # never the mask row
    d2t, t2d = mappings(ids, V)
    cfg = DrafterConfig.from_verifier(
        verifier.config, num_layers=2, block_size=block_size, aux_layer_ids=[1, 2, 4],
        mask_token_id=V - 1 if mask_token_id is None else mask_token_id, draft_vocab_size=draft_vocab,
        shift_label=shift_label, projector=projector, gru_hidden_size=32, bottleneck_size=16,
        correct_from=correct_from, attn_implementation=attn,
    )
    torch.manual_seed(seed)
    model = Drafter.from_verifier(verifier, cfg, d2t, t2d).to(verifier.dtype).eval()
    # random weights are near zero in the head's up projection; scale so corrections matter
    with torch.no_grad():
        if model.head is not None:
            model.head.up.weight.mul_(20)
    return model


@pytest.fixture(scope="session")
def verifier():
    return tiny_verifier()


@pytest.fixture
def one_thread():
    """Bitwise comparisons need one fixed thread count (subprocesses in the tests use 1 as well)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
