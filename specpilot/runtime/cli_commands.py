"""Bodies of `specpilot generate` and `specpilot serve`: resolve flags against a deployment,
read the prompts, build the engine, and print or serve the results."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import SpecPilotError
from .knobs import Knobs

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class EngineSpec:
    """Where the engine comes from, after `--deployment` defaults and explicit flags."""

    model: str
    knobs: Knobs
    device: str
    dtype: str
    max_new_tokens: int


@dataclass(frozen=True)
class PromptItem:
    id: str | int
    label: str  # names the prompt in error messages
    text: str | None = None
    ids: list[int] | None = None


def resolve_spec(model: str | None, deployment: str | None, drafter: str | None,
                 k: int | None, device: str | None, dtype: str | None, threads: int | None,
                 max_new_tokens: int | None, weights: str | None = None) -> EngineSpec:
    """Deployment values first, explicit flags over them, built-in defaults last
    (`weights`: the --weights flag, bf16 | w12)."""
    knobs, dev, dt, max_new = Knobs(), "cpu", "float32", 128
    if deployment:
        from specpilot.deployment import load_deployment

        d = load_deployment(deployment)
        knobs, dev, dt, max_new = d.stock_knobs(), d.device, d.dtype, d.max_new_tokens
        if model is None:
            if d.target.startswith("random:"):
                raise SpecPilotError(f"deployment {d.name!r} has a random-weight target "
                                     f"({d.target}) that cannot generate text: give --model DIR")
            model = d.target
    if model is None:
        raise SpecPilotError("no model: give --model DIR (an HF checkpoint) or --deployment NAME")
    changes = {}
    if drafter is not None:
        changes["drafter"] = drafter
    if k is not None:
        changes["k"] = k
    if threads is not None:
        changes["threads"] = threads
    if weights is not None:
        changes["weights"] = weights
    if changes:
        knobs = knobs.with_(**changes)
    dev = device or dev
    if dev not in DEVICES:
        raise SpecPilotError(f"unknown device {dev!r}: use cpu or cuda")
    max_new = max_new_tokens if max_new_tokens is not None else max_new
    if max_new < 1:
        raise SpecPilotError(f"--max-new-tokens must be >= 1, got {max_new}")
    return EngineSpec(model, knobs, dev, dtype or dt, max_new)


def parse_ids(s: str, where: str) -> list[int]:
    try:
        return [int(x) for x in s.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise SpecPilotError(f"{where}: token ids must be integers separated by commas, "
                             f"got {s!r}") from None


def read_prompts(prompt: str | None, input_ids: str | None,
                 prompts_file: Path | None) -> list[PromptItem]:
    given = [x is not None for x in (prompt, input_ids, prompts_file)]
    if sum(given) != 1:
        raise SpecPilotError("give exactly one of --prompt, --input-ids or --prompts-file")
    if prompt is not None:
        return [PromptItem(0, "--prompt", text=prompt)]
    if input_ids is not None:
        return [PromptItem(0, "--input-ids", ids=parse_ids(input_ids, "--input-ids"))]
    try:
        lines = Path(prompts_file).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecPilotError(f"cannot read prompts file {prompts_file}: {e}") from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{prompts_file} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecPilotError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or ("prompt" in row) == ("input_ids" in row):
            raise SpecPilotError(f"{where}: each line needs exactly one of 'prompt' (text) "
                                 "or 'input_ids' (a list of ints)")
        pid = row.get("id", len(items))
        if "prompt" in row:
            if not isinstance(row["prompt"], str):
                raise SpecPilotError(f"{where}: 'prompt' must be a string")
            items.append(PromptItem(pid, where, text=row["prompt"]))
        else:
            ids = row["input_ids"]
            if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                raise SpecPilotError(f"{where}: 'input_ids' must be a list of integers")
            items.append(PromptItem(pid, where, ids=ids))
    if not items:
        raise SpecPilotError(f"prompts file {prompts_file} holds no prompts")
    return items


def run_generate(spec: EngineSpec, items: list[PromptItem], *, ignore_eos: bool = False,
                 as_json: bool = False, batch: int | None = None) -> None:
    """Generate for every prompt (`batch` at a time, default all at once) and print."""
    from .factory import build_engine
    from .protocol import check_prompt, finish

    if batch is not None and batch < 1:
        raise SpecPilotError(f"--batch must be >= 1, got {batch}")
    batch = min(batch or len(items), len(items))
    # built for every size it runs: the full batches and a smaller last one
    sizes = tuple(sorted({batch, len(items) % batch or batch}))
    engine, tok = build_engine(spec.model, spec.knobs, spec.device, spec.dtype, sizes)
    prompts = [it.ids if it.ids is not None else tok.encode(it.text) for it in items]
    for it, ids in zip(items, prompts, strict=True):
        check_prompt(engine, ids, spec.max_new_tokens, it.label)
    for lo in range(0, len(items), batch):
        gens = engine.generate(prompts[lo:lo + batch], spec.max_new_tokens, ignore_eos)
        for it, g in zip(items[lo:lo + batch], gens, strict=True):
            text = finish(g.output_ids, g.finish_reason, (), tok.decode,
                          tuple(engine.eos_ids)).text
            if as_json:
                row = {"id": it.id, "prompt_ids": g.prompt_ids, "output_ids": g.output_ids,
                       "text": text, "finish_reason": g.finish_reason,
                       "metrics": asdict(g.metrics)}
                print(json.dumps(row), flush=True)
            elif len(items) > 1:
                print(f"--- {it.id} ---\n{text}", flush=True)
            else:
                print(text, flush=True)


def run_serve(spec: EngineSpec, host: str, port: int, max_batch: int) -> None:
    from .factory import build_engine
    from .server import check_port, serve_forever

    if max_batch < 1:
        raise SpecPilotError(f"--max-batch must be >= 1, got {max_batch}")
    check_port(port)  # before minutes of model loading
    # a server batches whatever is in flight: any size up to max_batch
    engine, tok = build_engine(spec.model, spec.knobs, spec.device, spec.dtype,
                               tuple(range(1, max_batch + 1)))
    print(f"specpilot: {spec.model} on {spec.device}/{spec.dtype}, drafter "
          f"{spec.knobs.drafter or 'none'} (k={engine.k}), max batch {max_batch}",
          file=sys.stderr, flush=True)
    serve_forever(engine, tok, host, port, max_batch=max_batch, model_path=spec.model,
                  default_max_tokens=spec.max_new_tokens)
