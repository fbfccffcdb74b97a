"""The lossless check of the benchmark: where two continuations part, and the near-tie rule."""

import torch

from domino.bench import divergence, lossless_verdict
from domino.decode import greedy_decode


def test_divergence_finds_the_position_and_the_logit_gap(verifier):
    prompt = [3, 14, 15, 9, 2, 6]
    ref = greedy_decode(verifier, prompt, 10).new_token_ids
    assert divergence(verifier, prompt, ref, list(ref)) is None
    # the verifier's runner-up at new token 4: the gap is its top-2 margin there
    with torch.no_grad():
        logits = verifier(input_ids=torch.tensor([prompt + ref[:4]])).logits[0, -1]
    top2 = logits.topk(2)
    other = ref[:4] + [int(top2.indices[1])] + ref[5:]
    d = divergence(verifier, prompt, ref, other)
    assert d["position"] == 4 and d["tokens"] == [ref[4], other[4]]
    assert abs(d["gap"] - float(top2.values[0] - top2.values[1])) < 1e-5  # float32 read-out
    # one output stopped early (an EOS): no rounding explains that
    d = divergence(verifier, prompt, ref, ref[:7])
    assert d == {"position": 7, "tokens": [ref[7], None], "gap": None}


def test_near_tie_verdict():
    d = {"position": 3, "tokens": [5, 6], "gap": 0.1}
    assert lossless_verdict(None, 0.0) == "same"
    assert lossless_verdict(d, 0.0) == "mismatch"  # exact mode: every divergence fails
    assert lossless_verdict(d, 0.25) == "near-tie"
    assert lossless_verdict({**d, "gap": 0.3}, 0.25) == "mismatch"
    assert lossless_verdict({**d, "gap": None}, 10.0) == "mismatch"


def test_decode_benchmark_script_runs(capsys, one_thread):
    """python -m domino.bench_decode prints its figures; outside float32 it counts partings."""
    from domino.bench_decode import main

    main(["--prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--threads", "1"])
    out = capsys.readouterr().out
    assert "plain greedy" in out and "oracle ideal speedup" in out and "parted" not in out
    main(["--prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--threads", "1", "--dtype", "bfloat16"])
    out = capsys.readouterr().out
    assert "bfloat16" in out and "parted from plain greedy:" in out
