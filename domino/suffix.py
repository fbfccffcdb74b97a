"""A suffix cache of token streams, drafting by frequency (SuffixDecoding, Oliaro et al., arXiv
2411.04975; the rule of ArcticInference's and vLLM's ``suffix`` method, written here).

``SuffixTree`` counts every substring of at most ``max_depth`` tokens of the streams it holds: the
node reached from the root by the tokens ``s`` holds ``count(s)``, the number of places where
``s`` starts. A stream grows one token at a time (``append``): the substrings that end at the new
token are the nodes reached from the root by each of the stream's last ``max_depth`` tokens, so a
token costs at most ``max_depth`` steps.

The draft rule (``SuffixTree.draft``), for the tail of a context:
- for each match length m = 1, 2, ... while the context's last m tokens occur in the tree,
- follow from that node the most frequent continuation (ties: the smaller token id), one token
  at a time, with ``prob *= count(child) / count(node)``, while ``prob >= min_token_prob`` and the
  draft is shorter than ``min(max_tokens, floor(m * max_spec_factor + max_spec_offset))``;
- the draft's score is the sum of its tokens' ``prob`` (an estimate of the tokens accepted);
- the best score over every m wins (ties: the longer match).
``SuffixDraft`` keeps two trees, as SuffixDecoding does: one over the current request (its prompt
and what it produced so far) and one over the earlier answers of the same job (``learn``), and
proposes the better-scored draft of the two.
"""

from __future__ import annotations

from dataclasses import dataclass


class _Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, _Node] = {}


@dataclass(frozen=True)
class SuffixDraftResult:
    """A draft, the estimated probability of each of its tokens (cumulative, as the rule
    multiplies them), the match length it came from and its score (the sum of ``probs``)."""

    tokens: list[int]
    probs: list[float]
    match: int

    @property
    def score(self) -> float:
        return sum(self.probs)


NO_DRAFT = SuffixDraftResult([], [], 0)


class SuffixTree:
    """The counts of every substring of at most ``max_depth`` tokens of the streams added."""

    def __init__(self, max_depth: int = 24):
        if max_depth < 1:
            raise ValueError(f"a suffix tree needs max_depth >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()
        self._open: list[_Node] = []  # the nodes of the current stream's last max_depth - 1 suffixes

    def start(self) -> None:
        """Begin a new stream: no substring runs across two streams."""
        self._open = []

    def append(self, token: int) -> None:
        """One more token of the current stream."""
        grown = []
        for node in [self.root, *self._open]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            grown.append(child)
        self._open = grown[: self.max_depth - 1]

    def add(self, tokens) -> None:
        """A whole stream of its own."""
        self.start()
        for t in tokens:
            self.append(t)
        self.start()

    def draft(self, context: list[int], max_tokens: int, max_spec_factor: float = 1.0,
              max_spec_offset: float = 0.0, min_token_prob: float = 0.1) -> SuffixDraftResult:
        """The best-scored draft after ``context`` (module docstring); ``NO_DRAFT`` when none."""
        best = NO_DRAFT
        for m in range(1, min(self.max_depth, len(context)) + 1):
            node = self.root
            for t in context[len(context) - m:]:
                node = node.children.get(t)
                if node is None:
                    return best  # a longer tail holds this one, so it does not occur either
            cap = min(max_tokens, int(m * max_spec_factor + max_spec_offset))
            tokens, probs, prob = [], [], 1.0
            depth = m
            while len(tokens) < cap and node.children and depth < self.max_depth:
                token, child = min(node.children.items(), key=lambda kv: (-kv[1].count, kv[0]))
                prob *= child.count / node.count
                if prob < min_token_prob:
                    break
                tokens.append(token)
                probs.append(prob)
                node, depth = child, depth + 1
            found = SuffixDraftResult(tokens, probs, m)
            if tokens and found.score >= best.score:
                best = found
        return best


class SuffixDraft:
    """The suffix cache as a drafter of the decoding loop (``domino.decode``): a tree over the
    current request, restarted by ``reset`` with the prompt and grown with every token the loop
    commits, and a tree over the earlier answers of the job (``learn``: the decoder's own output
    of an earlier prompt, never the current one's). No training and no verifier state. A step
    whose draft is empty is a plain verifier step, as the n-gram lookup's is.

    The context is kept as ``domino.decode.NgramDraft`` keeps it: each ``propose`` learns from its
    anchor's position how many of the previous step's drafts were accepted."""

    aux_layer_ids = None
    variable_drafts = True  # its drafts' length follows the match (the loop records every step that drafts)

    def __init__(self, drafts_per_step: int = 16, max_depth: int = 24, max_spec_factor: float = 1.0,
                 max_spec_offset: float = 0.0, min_token_prob: float = 0.1):
        if drafts_per_step < 1 or not 0 <= min_token_prob <= 1:
            raise ValueError(f"a suffix cache needs drafts >= 1 and 0 <= min_token_prob <= 1, got drafts "
                             f"{drafts_per_step}, min_token_prob {min_token_prob}")
        self.drafts_per_step, self.max_depth = drafts_per_step, max_depth
        self.rule = {"max_spec_factor": max_spec_factor, "max_spec_offset": max_spec_offset,
                     "min_token_prob": min_token_prob}
        self.answers = SuffixTree(max_depth)  # earlier answers of the job
        self.request = SuffixTree(max_depth)
        self.tokens: list[int] = []
        self.last: tuple[int, list[int]] = (-1, [])

    def reset(self, prompt_ids: list[int]) -> None:
        self.request = SuffixTree(self.max_depth)
        self.tokens, self.last = [], (-1, [])
        for t in prompt_ids:
            self._commit(t)

    def learn(self, answer: list[int]) -> None:
        """An earlier prompt's answer, as this decoder produced it, for the drafts of later prompts."""
        self.answers.add(answer)

    def add_context(self, aux, start: int) -> None:
        pass

    def _commit(self, token: int) -> None:
        self.tokens.append(token)
        self.request.append(token)

    def advance(self, anchor: int, anchor_pos: int) -> None:
        """Commit the previous step's accepted drafts and the anchor (``anchor_pos`` tells how many)."""
        prev_pos, prev = self.last
        if prev_pos >= 0:
            for t in prev[:anchor_pos - prev_pos - 1]:
                self._commit(t)
        self._commit(anchor)
        if len(self.tokens) != anchor_pos + 1:
            raise RuntimeError(f"suffix cache: the context holds {len(self.tokens)} tokens at anchor position {anchor_pos}")

    def best(self, n: int) -> SuffixDraftResult:
        """The better-scored draft of the two trees, at most ``n`` tokens (after ``advance``)."""
        tail = self.tokens[-self.max_depth:]
        a = self.request.draft(tail, n, **self.rule)
        b = self.answers.draft(tail, n, **self.rule)
        return b if b.score > a.score else a

    def propose(self, anchor: int, anchor_pos: int, n: int) -> list[int]:
        self.advance(anchor, anchor_pos)
        out = self.best(n).tokens if n > 0 else []
        self.sent(anchor_pos, out)
        return out

    def sent(self, anchor_pos: int, drafts: list[int]) -> None:
        """The drafts this step verifies after the anchor at ``anchor_pos``, whoever proposed them."""
        self.last = (anchor_pos, drafts)
