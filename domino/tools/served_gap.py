"""Where served acceptance is lost against teacher-forced: ``python -m domino.tools.served_gap --run DIR``.

The validate stage counts a drafter's acceptance length teacher-forced on the held-out split: the
corpus' conversations, every anchor, the target at each slot the verifier's greedy token over the
draft vocabulary, the context the features' stored aux states (``features.dtype``). The benchmark
counts it served: the verifier's own greedy answers to the suite's prompts, the steps the loop
visits, the context the verifier's states in its own dtype. This tool measures the conditions in
between, one change at a time, for every trained checkpoint of a finished run
(``results/train/*/checkpoint``), each an acceptance length with its 95% BCa interval over
conversations (prompts):

  held-out, every anchor      the validate stage's count, on the held-out features as stored (the
                              validate stage samples anchors; here every anchor counts)
  held-out, first answers     the same, on each held-out conversation's first assistant answer
                              cut to the suite's ``max_new_tokens`` (what the benchmark decodes)
  held-out, own answers       the same prompts (the conversation up to its first answer) answered
                              by the verifier, greedy, as the benchmark answers: what changes from
                              the line above is whose answers they are
  own answers, every anchor   the same count on the suite's prompts and plain greedy's answers to
                              them (``results/benchmark/<suite>/baseline.json``), the verifier's
                              states extracted here and rounded to ``features.dtype`` as training
                              read them: what changes is the domain and whose answers they are
  ... states unrounded        the verifier's states in its own dtype, as the loop hands them over
  ... the verifier's tokens   each slot's target the verifier's own next token, as the loop checks
                              it, not the best draft-vocabulary token teacher forcing scores (a
                              token outside the draft vocabulary is never accepted)
  ... the loop's anchors      the same drafts, counted only at the anchors the loop visits (an
                              accepted stretch is one step, not one anchor per token), walked from the
                              first answer token: teacher forcing of the served condition
  served                      the benchmark's own count (``<row>.json``), how many of its steps
                              accepted exactly what the walk accepted, and per prompt the first
                              step that did not (after it the two walk from other anchors)

It also says how often the verifier's next token lies outside the draft vocabulary (a draft there
can never be accepted; teacher forcing's target is the best draft-vocabulary token and is counted
right), over every answer token.

    python -m domino.tools.served_gap --run runs/smollm2-quick
    python -m domino.tools.served_gap --run runs/smollm2-quick --suite humaneval --out gap.json

A measurement script, not a test: it reads a finished run and writes nothing into it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..common import DTYPES, hardware
from ..data.features import _extract_part, load_features
from ..decode import decode
from ..io import read_json, write_json
from ..model import Drafter
from ..stats import RESAMPLES, acceptance_length_pooled, paired_relative_difference, ratio_of_sums
from ..train.batches import slot_targets, valid_anchor_mask
from ..verifier.load import eos_ids, load_tokenizer, load_verifier
from ..vocab import load_vocab, target_ids
from . import add_threads_argument, tool_parser


def anchor_runs(drafter: Drafter, ids: torch.Tensor, aux: torch.Tensor, target: torch.Tensor,
                loss_mask: torch.Tensor, loss_mask_at: str = "target", chunk: int = 64) -> dict[int, int]:
    """One conversation, teacher-forced: for every valid anchor ``a`` (``valid_anchor_mask``), how
    many of the block's drafting slots are right before the first wrong or unsupervised one (the
    drafts a served step at ``a`` accepts). ids, target, loss_mask: (T,); aux: (T, A*H)."""
    T, B, first = len(ids), drafter.cfg.block_size, drafter.cfg.first_draft_slot
    batch = {"input_ids": ids[None], "position_ids": torch.arange(T)[None], "doc_ids": torch.zeros(1, T, dtype=torch.long),
             "loss_mask": loss_mask[None].bool(), "target": target[None], "aux": aux[None]}
    anchors = valid_anchor_mask(batch["doc_ids"], batch["loss_mask"], B, loss_mask_at)[0].nonzero().flatten()
    out = {}
    for s in range(0, len(anchors), chunk):  # the draft mask grows with anchors x block
        a = anchors[s:s + chunk][None]
        ok = torch.ones_like(a, dtype=torch.bool)
        tgt, mask = slot_targets(batch, a, ok, B, drafter.cfg.shift_label, loss_mask_at)
        with torch.no_grad():
            _, final = drafter.forward_train(batch["input_ids"], batch["position_ids"], batch["doc_ids"],
                                             batch["aux"].to(drafter.fc.weight.dtype), a)
        hit = (final.argmax(-1) == tgt) & mask  # (1, N, B)
        accepted = hit[0, :, first:].long().cumprod(-1).sum(-1)
        out.update({int(x): int(r) for x, r in zip(a[0], accepted)})
    return out


def verifier_targets(ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """(T,) the target ``slot_targets`` reads at ``t - 1`` for the token at ``t``, as the loop
    checks a draft: the draft id of the verifier's own next token ``ids[t]`` (greedy answers are
    its argmax), -1 where the draft vocabulary lacks it (no draft matches); the last is -1."""
    tid = target_ids(d2t)
    to_draft = torch.full((int(max(tid.max(), ids.max())) + 1,), -1, dtype=torch.long)
    to_draft[tid] = torch.arange(len(tid))
    return torch.cat([to_draft[ids[1:]], torch.tensor([-1])])


def walk(accepted: dict[int, int], start: int) -> list[int]:
    """The accepted drafts of each step the loop takes from anchor ``start`` (the first answer
    token): a step at ``a`` accepts ``accepted[a]`` drafts and commits them and the verifier's own
    token, so the next step's anchor is ``a + accepted[a] + 1``; it stops at the first anchor without
    a count (the answer's end)."""
    out, a = [], start
    while a in accepted:
        out.append(accepted[a])
        a += accepted[a] + 1
    return out


def pooled(per_prompt: list[list[int]]) -> dict:
    """Acceptance length (1 + accepted drafts per step, pooled over steps) with its interval over
    prompts."""
    iv = acceptance_length_pooled([[int(x) for x in p] for p in per_prompt if p], resamples=RESAMPLES)
    return {"estimate": iv.estimate, "ci": [iv.low, iv.high], "steps": sum(len(p) for p in per_prompt)}


def every_anchor(per_prompt: list[dict[int, int]]) -> dict:
    """Acceptance length over every anchor (1 + the drafts it accepts), pooled, with its interval over prompts."""
    num = np.array([sum(1 + r for r in p.values()) for p in per_prompt if p], dtype=float)
    den = np.array([len(p) for p in per_prompt if p], dtype=float)
    iv = ratio_of_sums(num, den)
    return {"estimate": iv.estimate, "ci": [iv.low, iv.high], "anchors": int(den.sum())}


def sums(per_prompt: list[dict[int, int]] | list[list[int]]) -> tuple[list[float], list[float]]:
    """Per prompt, tokens committed (1 + accepted drafts, summed) and steps (anchors), the two
    sums an acceptance length pools."""
    counts = [list(p.values()) if isinstance(p, dict) else list(p) for p in per_prompt]
    return [float(sum(1 + r for r in x)) for x in counts], [float(len(x)) for x in counts]


def paired(a: list, b: list) -> dict:
    """A's acceptance length over B's, less one, over the prompts both count (same order), with
    its 95% BCa interval: how much the one change between the two conditions moves it."""
    (na, da), (nb, db) = sums(a), sums(b)
    keep = [i for i in range(len(da)) if da[i] and db[i]]
    iv = paired_relative_difference(*([x[i] for i in keep] for x in (na, da, nb, db)))
    return {"estimate": iv.estimate, "ci": [iv.low, iv.high], "prompts": len(keep)}


def own_answers(run: Path, suite: str, verifier, aux_ids: list[int], head: torch.Tensor, dtype: torch.dtype):
    """The suite's prompts with plain greedy's answers (``baseline.json``), the verifier's states over
    them in its own dtype: [(ids, aux, target, loss_mask, first answer position, prompt's task id)]."""
    plain = read_json(run / "results" / "benchmark" / suite / "baseline.json", "plain greedy's results")
    rows = [{"input_ids": p["prompt_token_ids"] + p["new_token_ids"],
             "loss_mask": [0] * len(p["prompt_token_ids"]) + [1] * len(p["new_token_ids"]),
             "task_id": p["task_id"], "start": len(p["prompt_token_ids"])}
            for p in plain["prompts"] if p.get("new_token_ids")]
    out = []
    for r in rows:
        t = _extract_part(verifier, [r], aux_ids, head, 1, dtype)
        out.append((t["input_ids"], t["aux"], t["target"], t["loss_mask"], r["start"], r["task_id"]))
    return out


def first_answers(held: dict, budget: int) -> list[tuple]:
    """Each held-out conversation's prompt (its tokens before the first assistant token) and first
    answer cut to ``budget`` tokens, with the stored states: [(ids, aux, target, loss_mask, start)];
    conversations without an answer are left out."""
    out, offs = [], held["offsets"].tolist()
    for s, e in zip(offs[:-1], offs[1:]):
        m = held["loss_mask"][s:e]
        if not m.any():
            continue
        start = int(m.nonzero()[0])
        end = start
        while end < len(m) and m[end] and end - start < budget:
            end += 1
        mask = torch.zeros(end, dtype=torch.bool)
        mask[start:end] = True
        out.append((held["input_ids"][s:s + end], held["aux"][s:s + end].float(), held["target"][s:s + end], mask, start))
    return out


def answered_here(verifier, prompts: list[list[int]], budget: int, stops, aux_ids, head, dtype) -> list[tuple]:
    """``prompts`` answered by the verifier, plain greedy up to ``budget`` tokens (``decode``), with
    its states over them: [(ids, aux, target, loss_mask, start)], one per prompt."""
    out = []
    for p in prompts:
        answer = decode(verifier, p, budget, stops).new_token_ids  # may be empty: no anchor then
        t = _extract_part(verifier, [{"input_ids": p + answer, "loss_mask": [0] * len(p) + [1] * len(answer)}],
                          aux_ids, head, 1, dtype)
        out.append((t["input_ids"], t["aux"], t["target"], t["loss_mask"], len(p)))
    return out


def outside_draft_vocab(rows, t2d: torch.Tensor) -> dict:
    """How many answer tokens (after the first) the draft vocabulary lacks (``t2d``: its mask over
    the target vocabulary, ``domino.vocab``)."""
    nxt = torch.cat([ids[start + 1:] for ids, _, _, _, start, _ in rows])
    miss = int((~t2d[nxt]).sum())
    return {"answer_tokens": len(nxt), "outside": miss, "share": miss / max(1, len(nxt))}


def parser():
    p = tool_parser("served_gap", __doc__)
    p.add_argument("--run", required=True, help="a finished run's directory (its results/)")
    p.add_argument("--suite", default="humaneval", help="the benchmark suite whose prompts and answers are read")
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    add_threads_argument(p)
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    run, suite = Path(args.run), args.suite
    res = run / "results"
    index = read_json(res / "extract_hidden_states" / "val" / "index.json", "features index", sealed=True)
    aux_ids, storage = index["aux_layer_ids"], DTYPES[index["dtype"]]
    plain = read_json(res / "benchmark" / suite / "baseline.json", "plain greedy's results")
    verifier_dtype = plain["protocol"]["verifier_dtype"]
    verifier = load_verifier(str(res / "verifier" / "model"), verifier_dtype, "cpu")
    d2t, t2d = load_vocab(res / "draft_vocab" / "vocab.safetensors")
    head = verifier.get_output_embeddings().weight[target_ids(d2t)]
    rows = own_answers(run, suite, verifier, aux_ids, head, DTYPES[verifier_dtype])
    held = load_features(res / "extract_hidden_states" / "val" / "index.json")
    offs = held["offsets"].tolist()
    budget = plain["protocol"]["max_new_tokens"]
    firsts = first_answers(held, budget)
    stops = eos_ids(load_tokenizer(str(res / "verifier" / "model")), verifier.config)
    held_own = answered_here(verifier, [f[0][:f[4]].tolist() for f in firsts], budget, stops, aux_ids, head,
                             DTYPES[verifier_dtype])
    figures = {"run": str(run), "suite": suite, "hardware": hardware(), "verifier_dtype": verifier_dtype,
               "features_dtype": index["dtype"], "prompts": len(rows), "held_out_conversations": len(offs) - 1,
               "held_out_answered": sum(int(h[3].any()) for h in held_own), "max_new_tokens": budget,
               "outside_draft_vocab": outside_draft_vocab(rows, t2d), "checkpoints": {}}
    for ck in sorted(d.parent.name for d in (res / "train").glob("*/checkpoint")):
        drafter = Drafter.load(res / "train" / ck / "checkpoint").float().eval()
        held_runs = [anchor_runs(drafter, held["input_ids"][s:e], held["aux"][s:e].float(), held["target"][s:e],
                                 held["loss_mask"][s:e]) for s, e in zip(offs[:-1], offs[1:])]
        first_runs = [anchor_runs(drafter, ids, aux, tgt, m) for ids, aux, tgt, m, _ in firsts]
        held_own_runs = [anchor_runs(drafter, ids, aux.to(storage).float(), tgt, m) for ids, aux, tgt, m, _ in held_own]
        rounded = [anchor_runs(drafter, ids, aux.to(storage).float(), tgt, m) for ids, aux, tgt, m, _, _ in rows]
        exact = [anchor_runs(drafter, ids, aux.float(), tgt, m) for ids, aux, tgt, m, _, _ in rows]
        checked = [anchor_runs(drafter, ids, aux.float(), verifier_targets(ids, d2t), m) for ids, aux, _, m, _, _ in rows]
        walked = [walk(r, start) for r, (*_, start, _) in zip(checked, rows)]
        served_file = res / "benchmark" / suite / f"{ck}.json"
        served = read_json(served_file, "benchmark results") if served_file.exists() else None
        c = {"held_out_every_anchor": every_anchor(held_runs), "held_out_first_answers": every_anchor(first_runs),
             "held_out_own_answers": every_anchor(held_own_runs), "own_answers_every_anchor": every_anchor(rounded),
             "own_answers_unrounded": every_anchor(exact), "own_answers_verifier_tokens": every_anchor(checked),
             "own_answers_loop_anchors": pooled(walked)}
        if served is not None:
            by_task = {q["task_id"]: q["accepted_per_step"] for q in served["prompts"]}
            steps = [by_task.get(task, []) for *_, task in rows]
            same = sum(int(a == b) for w, s in zip(walked, steps) for a, b in zip(w, s))
            parted = [next((i for i, (a, b) in enumerate(zip(w, s)) if a != b), None) for w, s in zip(walked, steps)]
            c["served"] = pooled(steps) | {"steps_as_walked": same, "steps_compared": sum(min(len(w), len(s)) for w, s
                                                                                          in zip(walked, steps)),
                                           # per prompt, the first step whose accepted count is not the walk's
                                           "first_parting_step": parted}
        c["changes"] = {  # paired over the same prompts: each one change from a condition to the next
            "answers (held-out prompts: own over the corpus')": paired(held_own_runs, first_runs),
            "states unrounded over rounded": paired(exact, rounded),
            "the verifier's tokens over the best draft-vocabulary ones": paired(checked, exact),
            "the loop's anchors over every anchor": paired(walked, checked)}
        if served is not None:
            c["changes"]["served over the loop's anchors, teacher-forced"] = paired(steps, walked)
        c["per_prompt"] = {k: sums(v) for k, v in (("held_out_first_answers", first_runs),
                                                    ("held_out_own_answers", held_own_runs),
                                                    ("own_answers_every_anchor", rounded),
                                                    ("own_answers_verifier_tokens", checked), ("own_answers_loop_anchors", walked))}
        figures["checkpoints"][ck] = c
        print(f"{ck}: " + "; ".join(f"{k} {v['estimate']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]"
                                     for k, v in c.items() if "estimate" in v), flush=True)
        print(f"{ck}, changes: " + "; ".join(f"{k} {v['estimate']:+.1%} [{v['ci'][0]:+.1%}, {v['ci'][1]:+.1%}]"
                                             for k, v in c["changes"].items()), flush=True)
    o = figures["outside_draft_vocab"]
    print(f"answer tokens outside the draft vocabulary: {o['outside']} of {o['answer_tokens']} ({o['share']:.1%})")
    if args.out:
        write_json(args.out, figures)


if __name__ == "__main__":
    main()
