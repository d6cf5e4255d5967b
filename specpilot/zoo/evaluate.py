"""Evaluate the zoo: held-out loss / perplexity of the target, and acceptance of each drafter
measured with the real Engine (greedy, lossless-checked against plain AR decoding).

    specpilot zoo eval --models models/tiny-pycode --workload tiny-pycode-dev --ks 2,4,8
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..runtime.errors import SpecPilotError


@dataclass
class HeldoutResult:
    loss: float
    perplexity: float
    tokens: int
    windows: int


@dataclass
class AcceptanceRow:
    drafter: str  # "ar" | "draft" | "block" | "ngram"
    k: int
    prompts: int
    new_tokens: int
    accept_length: float  # mean over prompts of committed tokens / verify steps
    lossless: bool  # every output identical to the target's greedy (AR) output
    mismatches: int
    tok_per_s: float  # new tokens / (prefill + decode) wall-clock seconds
    seconds: float


@torch.no_grad()
def heldout_loss(model_dir: str | Path, stdlib: str | None = None, seq_len: int = 512,
                 windows: int = 128) -> HeldoutResult:
    """Mean next-token loss of the runtime model (fp32) on fixed held-out windows."""
    from tokenizers import Tokenizer

    from ..runtime.loader import load_model
    from .corpus import EOT, corpus_texts, list_files
    from .train import encode_stream, eval_windows

    model_dir = Path(model_dir)
    model = load_model(model_dir, "cpu", "float32")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    held = encode_stream(tok, [t for _, t in corpus_texts(list_files(stdlib), "heldout")],
                         tok.token_to_id(EOT))
    w = eval_windows(held, windows, seq_len)
    total, count = 0.0, 0
    pos = torch.arange(seq_len)[None]
    for i in range(0, len(w), 8):
        x = w[i: i + 8]
        logits, _ = model(x[:, :-1], pos.expand(len(x), -1), use_cache=False)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(),
                                                 reduction="sum")
        total += float(loss)
        count += x[:, 1:].numel()
    mean = total / count
    return HeldoutResult(mean, math.exp(mean), count, len(w))


def parse_ks(ks: str) -> tuple[int, ...]:
    """`--ks 2,4,8` as a tuple of integers (`check_args` checks their range)."""
    try:
        return tuple(int(k) for k in ks.split(",") if k.strip())
    except ValueError:
        raise SpecPilotError(f"--ks must be comma-separated integers in 1..32, e.g. 2,4,8; "
                             f"got {ks!r}") from None


def check_args(ks: tuple[int, ...], max_new_tokens: int, batch_size: int, threads: int,
               limit: int) -> None:
    """One-line errors for out-of-range `zoo eval` options, before any model loads."""
    if not ks or any(not isinstance(k, int) or not 1 <= k <= 32 for k in ks):
        raise SpecPilotError(f"--ks must be integers in 1..32 (a Knobs k), got {list(ks)}")
    for name, value, low in (("--max-new-tokens", max_new_tokens, 1),
                             ("--batch-size", batch_size, 1), ("--threads", threads, 0),
                             ("--limit", limit, 0)):
        if value < low:
            raise SpecPilotError(f"{name} must be >= {low}, got {value}")


def _run(engine, prompts: list[list[int]], max_new_tokens: int, batch_size: int):
    gens, t0 = [], time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        gens.extend(engine.generate(prompts[i: i + batch_size], max_new_tokens))
    return gens, time.perf_counter() - t0


def drafter_specs(models: str | Path) -> dict[str, str]:
    """The drafters of a zoo directory: draft, block (where present) and ngram."""
    models = Path(models)
    specs = {}
    for kind in ("draft", "block"):
        if (models / kind / "config.json").is_file():
            specs[kind] = f"{kind}:{models / kind}"
    specs["ngram"] = "ngram"
    return specs


def acceptance(models: str | Path, workload: str, ks: tuple[int, ...] = (2, 4, 8),
               max_new_tokens: int = 96, batch_size: int = 1, threads: int = 2,
               drafters: tuple[str, ...] = ("draft", "block", "ngram"),
               limit: int = 0, progress: bool = False) -> list[AcceptanceRow]:
    """AR, then every drafter at every k (k capped at a block drafter's block size - 1)."""
    from ..bench.workloads import load_workload
    from ..runtime.factory import build_engine
    from ..runtime.knobs import Knobs

    check_args(ks, max_new_tokens, batch_size, threads, limit)
    models = Path(models)
    target = models / "target"
    if not (target / "config.json").is_file():
        raise SpecPilotError(f"no target checkpoint in {target}: train one with "
                             f"`specpilot zoo train`")
    engine, tok = build_engine(target, Knobs.from_dict({"threads": threads}))
    wl = load_workload(workload, tok)
    prompts = wl.prompt_ids(tok)
    if limit:
        prompts = prompts[:limit]
    ref, secs = _run(engine, prompts, max_new_tokens, batch_size)
    n_new = sum(len(g.output_ids) for g in ref)
    rows = [AcceptanceRow("ar", 0, len(prompts), n_new, 1.0, True, 0, n_new / secs, secs)]
    specs = drafter_specs(models)
    for name in drafters:
        if name not in specs:
            continue
        kset = ks
        if name == "block":  # a block of B proposes at most B - 1 drafts
            import json

            max_k = json.loads((models / "block" / "config.json").read_text())["block_size"] - 1
            kset = tuple(sorted({k for k in ks if k <= max_k} | {max_k}))
        for k in kset:
            knobs = Knobs.from_dict({"drafter": specs[name], "k": k, "threads": threads})
            engine, _ = build_engine(target, knobs)
            gens, secs = _run(engine, prompts, max_new_tokens, batch_size)
            bad = sum(g.output_ids != r.output_ids for g, r in zip(gens, ref))
            acc = sum(g.metrics.accept_length for g in gens) / len(gens)
            new = sum(len(g.output_ids) for g in gens)
            rows.append(AcceptanceRow(name, k, len(prompts), new, acc, bad == 0, bad,
                                      new / secs, secs))
            if progress:
                print(f"  {name} k={k}: accept {acc:.2f}, {new / secs:.1f} tok/s, "
                      f"{'lossless' if bad == 0 else f'{bad} MISMATCHES'}", flush=True)
    return rows


def print_rows(rows: list[AcceptanceRow], title: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in ("drafter", "k", "prompts", "new tokens", "accept len", "lossless", "tok/s",
              "speedup"):
        t.add_column(c)
    ar = next((r.tok_per_s for r in rows if r.drafter == "ar"), float("nan"))
    for r in rows:
        t.add_row(r.drafter, str(r.k), str(r.prompts), str(r.new_tokens),
                  f"{r.accept_length:.2f}", "yes" if r.lossless else f"NO ({r.mismatches})",
                  f"{r.tok_per_s:.1f}", f"{r.tok_per_s / ar:.2f}x")
    Console().print(t)


def main(models: str, workload: str, ks: str, max_new_tokens: int, batch_size: int,
         threads: int, limit: int = 0, heldout: bool = True) -> None:
    """`specpilot zoo eval`: held-out perplexity, then the acceptance table."""
    ks_t = parse_ks(ks)
    check_args(ks_t, max_new_tokens, batch_size, threads, limit)
    if heldout:
        h = heldout_loss(Path(models) / "target")
        print(f"target held-out loss {h.loss:.4f} (perplexity {h.perplexity:.2f}) over "
              f"{h.tokens} tokens")
    rows = acceptance(models, workload, ks_t, max_new_tokens, batch_size, threads, limit=limit,
                      progress=True)
    print_rows(rows, f"{workload}, batch {batch_size}, {max_new_tokens} new tokens")
    if not all(r.lossless for r in rows):
        raise SpecPilotError("a drafter changed the output: speculative decoding was not lossless")
