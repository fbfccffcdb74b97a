"""The suffix cache (``domino.suffix``): the tree's counts and drafts against a brute-force
reference on random token streams, and the drafter's bookkeeping in the decoding loop."""

import random

import pytest

from domino.suffix import SuffixDraft, SuffixTree


def brute_counts(streams, max_depth):
    """count(s) for every substring s of at most max_depth tokens: the places where it starts."""
    counts = {}
    for s in streams:
        for i in range(len(s)):
            for m in range(1, min(max_depth, len(s) - i) + 1):
                key = tuple(s[i:i + m])
                counts[key] = counts.get(key, 0) + 1
    return counts


def brute_draft(streams, context, max_depth, max_tokens, factor, offset, min_prob):
    """The module docstring's rule, written from the counts alone."""
    counts = brute_counts(streams, max_depth)
    best = ([], [], 0)
    for m in range(1, min(max_depth, len(context)) + 1):
        key = tuple(context[len(context) - m:])
        if key not in counts:
            break
        cap = min(max_tokens, int(m * factor + offset))
        tokens, probs, prob = [], [], 1.0
        while len(tokens) < cap and len(key) < max_depth:
            nexts = [(c, k[-1]) for k, c in counts.items() if len(k) == len(key) + 1 and k[:-1] == key]
            if not nexts:
                break
            c, t = min(nexts, key=lambda x: (-x[0], x[1]))
            prob *= c / counts[key]
            if prob < min_prob:
                break
            tokens.append(t)
            probs.append(prob)
            key = key + (t,)
        if tokens and sum(probs) >= sum(best[1]):
            best = (tokens, probs, m)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_tree_counts_and_drafts_as_the_brute_force_reference(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5])
    depth = rng.choice([1, 3, 6])
    streams = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 4))]
    tree = SuffixTree(depth)
    for s in streams:
        tree.add(s)
    counts = brute_counts(streams, depth)

    def walk(key):
        node = tree.root
        for t in key:
            node = node.children[t]
        return node.count

    assert all(walk(k) == c for k, c in counts.items())
    for _ in range(20):
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 10))]
        rule = dict(max_tokens=rng.choice([1, 4, 8]), factor=rng.choice([0.5, 1.0, 2.0]),
                    offset=rng.choice([0.0, 1.0]), min_prob=rng.choice([0.0, 0.1, 0.5]))
        got = tree.draft(context, rule["max_tokens"], rule["factor"], rule["offset"], rule["min_prob"])
        want = brute_draft(streams, context, depth, rule["max_tokens"], rule["factor"], rule["offset"],
                           rule["min_prob"])
        assert (got.tokens, got.match) == (want[0], want[2] if want[0] else 0)
        assert got.probs == pytest.approx(want[1])


def test_a_stream_grown_token_by_token_counts_as_one_added_whole():
    a, b = SuffixTree(4), SuffixTree(4)
    stream = [1, 2, 1, 2, 3, 1, 2]
    a.add(stream)
    b.start()
    for t in stream:
        b.append(t)
    assert a.draft([1, 2], 4) == b.draft([1, 2], 4)
    assert a.draft([1, 2], 4).tokens == [1, 2]  # 1 2 -> {1: once, 3: once}: the smaller id


def test_the_drafter_drafts_from_an_earlier_answer_and_commits_what_was_accepted():
    d = SuffixDraft(drafts_per_step=4, max_depth=8)
    d.learn([7, 8, 9, 10, 11])  # an earlier prompt's answer
    d.reset([1, 2, 7])
    # anchor 8 at position 3: the answer tree continues 7 8 with 9 10 (capped by the match length 2)
    assert d.propose(8, 3, 4) == [9, 10]
    # the verifier accepted one draft (9) and gave 5: the next anchor 5 stands at position 5
    assert d.propose(5, 5, 4) == []
    assert d.tokens == [1, 2, 7, 8, 9, 5]


def test_a_request_tree_never_sees_an_earlier_request():
    d = SuffixDraft(drafts_per_step=4)
    d.reset([1, 2, 3, 1, 2])
    assert d.propose(3, 5, 4)  # 1 2 3 occurs earlier in the request
    d.reset([4, 5])
    assert d.propose(6, 2, 4) == []  # nothing learnt: the earlier request left no trace


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_depth >= 1"):
        SuffixTree(0)
    with pytest.raises(ValueError, match="drafts >= 1"):
        SuffixDraft(drafts_per_step=0)
