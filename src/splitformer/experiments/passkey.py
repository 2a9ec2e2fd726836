"""The passkey test of docs/cache.md: retrieval, where eviction hurts.

    python -m splitformer.experiments.passkey run   [--out results/cache] [--lengths 1024,2048,4096]
                                                    [--placements 10] [--batch 10]
                                                    [--budgets 0.25]
                                                    [--policies full,streaming,snapkv:window=10]
    python -m splitformer.experiments.passkey table [--out results/cache] [--seconds]

A 5-digit number is stated once in filler text (the sentences of Mohtashami and Jaggi's
passkey test, 2023), at ``placements`` depths spread evenly from the start to the end of the
filler, and asked for at the end. Each prompt has exactly ``length`` tokens (SmolLM2's
tokenizer; the filler cut to fit). The prompts of one length run in batches of ``--batch``,
each streamed through the model on one KV tape under the cache policy (forwards of ``--chunk``
tokens, the policy acting after each), then decoded greedily for 8 tokens; a row is right when
the decoded text holds the number. A policy is a name or a name with its options
(``snapkv:window=10``, as ``splitformer cache --policy`` takes it). ``--decode budget`` (the
default) keeps the policy acting during decoding (the budget a fraction of every token seen);
``--decode append`` is kvpress's and SnapKV's protocol: the prompt compressed to the budget,
the decoded tokens appended whole. One JSON
row per (length, policy, budget, chunk, decode) is appended to OUT/passkey.jsonl (a row
already there is not recomputed: kill and rerun resumes).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ..usage import Parser, argument_type, int_list, positive_int
from .rows import answered, append_row, read_rows, say

__all__ = ["main", "prompts"]

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
          "again. ")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
NEW_TOKENS = 8


def prompts(tokenizer, length: int, placements: int, seed: int = 0
            ) -> tuple[torch.Tensor, list[str]]:
    """``placements`` prompts of exactly ``length`` tokens, (placements, length), and their
    keys: filler, the needle at depth i / (placements - 1) of the filler, filler, the
    question."""
    gen = torch.Generator().manual_seed(seed + length)
    keys = [str(int(k)) for k in torch.randint(10000, 100000, (placements,), generator=gen)]
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    unit = enc(FILLER)
    question = enc(QUESTION)
    rows = []
    for i, key in enumerate(keys):
        needle = enc(NEEDLE.format(key=key))
        room = length - len(needle) - len(question)
        if room < 2 * len(unit):
            raise ValueError(f"length {length} is too short for the needle and the question")
        filler = (unit * (room // len(unit) + 1))[:room]
        depth = 0 if placements == 1 else round(i * room / (placements - 1))
        depth -= depth % len(unit) if depth < room else 0  # the needle between two sentences
        rows.append(filler[:depth] + needle + filler[depth:] + question)
    return torch.tensor(rows), keys


DECODE = ("budget", "append")


def run_row(model, ids: torch.Tensor, keys: Sequence[str], policy, chunk: int,
            decode: str = "budget") -> dict:
    """Prefill ``ids`` (B, L) on one tape under ``policy`` in ``chunk``-token forwards, decode
    greedily (``decode``: the policy acting on, or the prompt's compressed cache held and the
    new tokens appended); which rows name their key."""
    import dataclasses

    from ..operators.tape import KVTape

    tokenizer = model.tokenizer
    tape = KVTape(capacity=0 if policy is not None and policy.compresses
                  else ids.shape[1] + NEW_TOKENS, policy=policy)
    t0 = time.perf_counter()
    with torch.no_grad():
        for start in range(0, ids.shape[1], chunk):
            logits = model(ids[:, start:start + chunk], tape=tape).logits
        if decode == "append" and policy is not None and policy.compresses:
            # a count budget the decoded tokens never exceed: nothing more is dropped
            tape.policy = dataclasses.replace(policy,
                                              budget=tape.entries_per_head + NEW_TOKENS)
        new = []
        for _ in range(NEW_TOKENS):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            new.append(nxt)
            logits = model(nxt, tape=tape).logits
    out = torch.cat(new, dim=1)
    texts = [tokenizer.decode(r, skip_special_tokens=True) for r in out.tolist()]
    right = [key in text for key, text in zip(keys, texts, strict=True)]
    return {"right": right, "accuracy": sum(right) / len(right), "answers": texts,
            "keys": list(keys), "peak_bytes": tape.peak_bytes,
            "seconds": time.perf_counter() - t0}


def run(out: Path, lengths: Sequence[int], placements: int, policies: Sequence[str],
        budgets: Sequence[float], chunk: int, decode: str = "budget", batch: int = 10,
        model=None) -> None:
    """Append the rows not yet in OUT/passkey.jsonl (module docstring); ``model``: a causal LM
    with a ``tokenizer`` (default: the packaged SmolLM2)."""
    from ..interop import from_hf

    if not (isinstance(batch, int) and batch >= 1 and isinstance(placements, int)
            and placements >= 1):
        raise ValueError(f"batch and placements must be ints >= 1, got {batch!r} and "
                         f"{placements!r}")
    from ..operators.cache_policy import cache_policy

    path = out / "passkey.jsonl"
    done = {(r["length"], r["policy"], r["budget"], r["placements"], r["chunk"],
             r.get("decode", "budget")) for r in read_rows(path)}
    todo = {(n, name, b, placements, chunk, decode) for n in lengths for name in policies
            for b in ([1.0] if name == "full" else budgets)}
    if todo <= done:
        say(f"{path}: every row is there")
        return
    model = (from_hf("smollm2") if model is None else model).eval()
    trained = model.trained_positions
    past = [n for n in lengths if trained is not None and n > trained]
    if past:  # not refused: reading past the trained grid is a measurement too (extrapolation)
        say(f"warning: --lengths {','.join(map(str, past))} past the model's {trained} trained "
            "positions: extrapolation in x, no rope rule (docs/context.md)")
    for length in lengths:
        ids, keys = prompts(model.tokenizer, length, placements)
        for name in policies:
            for budget in ([1.0] if name == "full" else budgets):
                if (length, name, budget, placements, chunk, decode) in done:
                    continue
                say(f"{length} tokens, {name} {budget}")
                parts = [run_row(model, ids[a:a + batch], keys[a:a + batch],
                                 cache_policy(name, budget), chunk, decode)
                         for a in range(0, placements, batch)]
                row = {k: sum((p[k] for p in parts), []) for k in ("right", "answers", "keys")}
                row.update(accuracy=sum(row["right"]) / placements,
                           peak_bytes=max(p["peak_bytes"] for p in parts),
                           seconds=sum(p["seconds"] for p in parts),
                           batch=min(batch, placements))
                row.update(length=length, policy=name, budget=budget, placements=placements,
                           chunk=chunk, decode=decode, threads=torch.get_num_threads())
                append_row(path, row, key=("length", "policy", "budget", "placements",
                                           "chunk", "decode"))
                say(f"  accuracy {row['accuracy']:.2f} in {row['seconds']:.0f} s")


def table(out: Path, seconds: bool = False) -> None:
    """One table per protocol (prefill chunk, or compressed once when the chunk holds the whole
    prompt; decoding under the budget or appended): right answers per policy, budget and
    length (with ``seconds`` each row's time, summed over its batches); then each row against
    the full cache's on the same prompts (``against_full``)."""
    from ..operators.cache_policy import POLICIES, policy_spec

    rows = read_rows(out / "passkey.jsonl")
    order = list(POLICIES)

    def protocol(r: dict) -> tuple[int, str]:
        return (0 if r["chunk"] >= r["length"] else r["chunk"], r.get("decode", "budget"))

    for chunk, decode in sorted({protocol(r) for r in rows}):
        these = [r for r in rows if protocol(r) == (chunk, decode)]
        lengths = sorted({r["length"] for r in these})
        keys = sorted({(r["policy"], r["budget"]) for r in these},
                      key=lambda k: (-k[1], order.index(policy_spec(k[0])[0]), k[0]))
        print("\n" + ("compressed once, after the question" if chunk == 0 else
                      f"prefill in chunks of {chunk} tokens (the policy acting after each)")
              + "; " + ("decoding under the budget" if decode == "budget" else
                        "the decoded tokens appended to the compressed prompt"))
        print("| policy | budget | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
        print("|---|---|" + "---|" * len(lengths))
        cell_of = {(x["policy"], x["budget"], x["length"]): x for x in these}
        for policy, budget in keys:
            cells = []
            for n in lengths:
                r = cell_of.get((policy, budget, n))
                cell = "" if r is None else f"{sum(r['right'])}/{len(r['right'])}"
                cells.append(f"{cell} ({r['seconds']:.0f} s)" if r and seconds else cell)
            print(f"| {policy} | {budget:g} | " + " | ".join(cells) + " |")
        against_full([cell_of[(p, b, n)] for p, b in keys for n in lengths
                      if (p, b, n) in cell_of], cell_of)


def against_full(rows: list[dict], cell_of: dict) -> None:
    """Each of ``rows`` against the full cache's row of the same length (``cell_of``: rows by
    (policy, budget, length)), prompt by prompt: the
    prompts it gets right where the full cache does not (b), wrong where the full cache is
    right (c), and McNemar's exact test of b against c (the two-sided binomial test of
    min(b, c) in b + c at 1/2, ``scipy.stats.binomtest``)."""
    from scipy import stats

    lines = []
    for r in rows:
        policy, budget, n = r["policy"], r["budget"], r["length"]
        full = cell_of.get(("full", 1.0, n))
        if policy == "full" or full is None or full["keys"] != r["keys"]:
            continue
        b = sum(x and not f for x, f in zip(r["right"], full["right"], strict=True))
        c = sum(f and not x for x, f in zip(r["right"], full["right"], strict=True))
        p = 1.0 if b + c == 0 else stats.binomtest(min(b, c), b + c, 0.5).pvalue
        lines.append(f"| {policy} | {budget:g} | {n} | {b} | {c} | {p:.2g} |")
    if lines:
        print("\nagainst the full cache, prompt by prompt (McNemar's exact test)")
        print("| policy | budget | tokens | right where full is wrong | wrong where full is "
              "right | p |")
        print("|---|---|---|---|---|---|")
        print("\n".join(lines))


PROG = "python -m splitformer.experiments.passkey"


def _parser() -> argparse.ArgumentParser:
    from ..operators.cache_policy import POLICIES, budget_list, policy_list

    p = Parser(
        prog=PROG,
        description="The passkey test of docs/cache.md on SmolLM2: run appends rows to "
                    "OUT/passkey.jsonl (resumable), table prints them.")
    sub = p.add_subparsers(dest="what", required=True, metavar="{run,table}")
    run_p = sub.add_parser("run", help="run the test, appending the rows not yet in --out")
    table_p = sub.add_parser("table", help="print the rows in --out")
    for q in (run_p, table_p):
        q.add_argument("--out", type=Path, default=Path("results/cache"),
                       help="folder of passkey.jsonl (default results/cache)")
    run_p.add_argument("--lengths", type=int_list(128, why="(prompt lengths in tokens)"),
                       default=(1024, 2048, 4096),
                       help="prompt lengths in tokens (default 1024,2048,4096)")
    run_p.add_argument("--placements", type=positive_int, default=10,
                       help="needle depths per length (default 10)")
    run_p.add_argument("--batch", type=positive_int, default=10,
                       help="prompts per forward (default 10). Memory: an observing policy "
                            "holds batch x heads x chunk x length mask entries; compressed "
                            "once (--chunk the length) batch x heads x min(512, observed "
                            "queries) x length")
    run_p.add_argument("--policies", type=argument_type(policy_list), default=tuple(POLICIES),
                       help=f"cache policies, each a name or name:key=value:... "
                            f"(snapkv:window=10; default all: {', '.join(POLICIES)})")
    run_p.add_argument("--budgets", type=argument_type(budget_list), default=(0.25,),
                       help="budgets, fractions of the tokens seen (default 0.25)")
    run_p.add_argument("--chunk", type=positive_int, default=256,
                       help="tokens per prefill forward, the policy acting after each "
                            "(default 256; the prompt's length: compress once, after the "
                            "question)")
    run_p.add_argument("--decode", choices=DECODE, default="budget",
                       help="budget: the policy acts during decoding too (the default); "
                            "append: the prompt's compressed cache held and the decoded tokens "
                            "appended (kvpress's protocol)")
    run_p.add_argument("--threads", type=positive_int, default=None,
                       help="torch threads (default: torch's choice)")
    table_p.add_argument("--seconds", action="store_true",
                         help="each row's seconds beside its right answers")
    table_p.set_defaults(threads=None)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    from .context import parse

    a = parse(_parser(), argv, "passkey.jsonl")
    if a.what == "table":
        answered(PROG, lambda: table(a.out, a.seconds))
        return
    answered(PROG, lambda: run(a.out, a.lengths, a.placements, a.policies, a.budgets, a.chunk,
                               a.decode, a.batch), kept=a.out / "passkey.jsonl")


if __name__ == "__main__":
    main()
