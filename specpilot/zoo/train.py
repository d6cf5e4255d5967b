"""The seeded recipe that trains the tiny zoo: tokenizer, target, draft model and block drafter.

    PYTHONPATH=. python3 -m specpilot.zoo.train --out models/tiny-pycode --device cuda
    specpilot zoo train --preset tiny --out /tmp/zoo            # seconds, on CPU

Stages: a byte-level BPE on the train split of the stdlib corpus; a Qwen3 target selected
by held-out loss (it overfits the small corpus within a few thousand steps); a smaller
Qwen3 draft and a block drafter distilled on the *target's* argmax (what acceptance
measures) plus its soft distribution. Weights are stored in bf16. Imports are kept to
torch, tokenizers, transformers and safetensors so the recipe runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..runtime.errors import SpecPilotError
from .corpus import EOT, MASK, corpus_texts, list_files, stdlib_root
from .tokenizer_train import save_tokenizer, train_tokenizer

STAGES = ("target", "draft", "block")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


@dataclass(frozen=True)
class Preset:
    name: str
    vocab_size: int
    seq_len: int
    batch: int
    target: Shape
    draft: Shape
    target_steps: int
    target_lr: float
    eval_every: int
    eval_windows: int
    draft_steps: int
    draft_lr: float
    block_steps: int
    block_lr: float
    block_size: int
    block_layers: int = 2
    block_n: int = 32  # blocks per training sequence
    warmup: int = 200
    weight_decay: float = 0.1
    attention_dropout: float = 0.1
    max_files: int = 0  # 0 = the whole corpus; else the first N train and N//8 held-out files
    max_stage_seconds: float = 0.0  # 0 = no cap; else a stage stops early (and says so)


PRESETS = {
    "full": Preset(
        name="full", vocab_size=4096, seq_len=512, batch=32,
        target=Shape(256, 6, 4, 2, 64, 768), draft=Shape(128, 2, 2, 1, 64, 384),
        target_steps=5000, target_lr=1.5e-3, eval_every=250, eval_windows=128,
        draft_steps=8000, draft_lr=2e-3, block_steps=8000, block_lr=1.5e-3, block_size=8,
    ),
    "tiny": Preset(
        name="tiny", vocab_size=384, seq_len=64, batch=4,
        target=Shape(32, 2, 2, 1, 16, 64), draft=Shape(16, 1, 1, 1, 16, 32),
        target_steps=6, target_lr=1e-3, eval_every=3, eval_windows=4,
        draft_steps=4, draft_lr=1e-3, block_steps=4, block_lr=1e-3, block_size=4,
        block_layers=1, block_n=4, warmup=2, max_files=24,
    ),
}


@dataclass
class StageResult:
    stage: str
    steps: int
    seconds: float
    best_step: int = 0
    heldout_loss: float | None = None
    extra: dict | None = None


def log(msg: str) -> None:
    print(f"[zoo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def qwen3_config(shape: Shape, vocab: int, eos_id: int, dropout: float = 0.0):
    import transformers

    return transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        max_position_embeddings=2048, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, attention_dropout=dropout,
        eos_token_id=eos_id, bos_token_id=None, pad_token_id=eos_id,
    )


def new_model(shape: Shape, vocab: int, eos_id: int, seed: int, dropout: float, device):
    import transformers

    torch.manual_seed(seed)
    cfg = qwen3_config(shape, vocab, eos_id, dropout)
    cfg._attn_implementation = "sdpa"
    return transformers.Qwen3ForCausalLM(cfg).to(device)


def encode_stream(tok, texts: list[str], eos_id: int) -> torch.Tensor:
    """All texts encoded and joined, each followed by the end-of-text id (int32)."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.int32)


def sample_batch(data: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator,
                 device) -> torch.Tensor:
    """`batch` random windows of seq_len + 1 tokens, [batch, seq_len + 1] long."""
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    return data[idx].long().to(device)


def eval_windows(data: torch.Tensor, n: int, seq_len: int) -> torch.Tensor:
    """n evenly spaced held-out windows (fixed, so every evaluation sees the same tokens)."""
    n = max(1, min(n, (len(data) - 1) // (seq_len + 1)))
    step = (len(data) - seq_len - 1) // n
    idx = torch.arange(n)[:, None] * step + torch.arange(seq_len + 1)
    return data[idx].long()


def capped(p: Preset, t0: float) -> bool:
    if p.max_stage_seconds and time.perf_counter() - t0 > p.max_stage_seconds:
        log(f"stage stopped at its time cap of {p.max_stage_seconds:.0f}s")
        return True
    return False


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def make_optimizer(model: torch.nn.Module, lr: float, wd: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def autocast(device):
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, device, chunk: int = 16) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), chunk):
        w = windows[i: i + chunk].to(device)
        with autocast(device):
            logits = model(input_ids=w[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
        total += float(loss)
        count += w[:, 1:].numel()
    model.train()
    return total / count


def train_target(p: Preset, train: torch.Tensor, held: torch.Tensor, eos_id: int, seed: int,
                 device) -> tuple[torch.nn.Module, StageResult]:
    """Train the target; keep the weights with the lowest held-out loss."""
    model = new_model(p.target, p.vocab_size, eos_id, seed, p.attention_dropout, device)
    opt = make_optimizer(model, p.target_lr, p.weight_decay)
    gen = torch.Generator().manual_seed(seed + 1)
    windows = eval_windows(held, p.eval_windows, p.seq_len)
    best, best_step, best_state, curve = float("inf"), 0, None, []
    t0 = time.perf_counter()
    model.train()
    done = 0
    for step in range(1, p.target_steps + 1):
        if capped(p, t0):
            break
        done = step
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, p.target_steps, p.target_lr, p.warmup)
        x = sample_batch(train, p.batch, p.seq_len, gen, device)
        with autocast(device):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % p.eval_every == 0 or step == p.target_steps or capped(p, t0):
            hl = heldout_loss(model, windows, device)
            curve.append((step, round(loss.item(), 4), round(hl, 4)))
            log(f"target step {step}: train {loss.item():.3f} held-out {hl:.3f}")
            if hl < best:
                best, best_step = hl, step
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in
                              model.state_dict().items()}
    model.load_state_dict(best_state)
    model.config.attention_dropout = 0.0
    res = StageResult("target", done, time.perf_counter() - t0, best_step, best,
                      {"curve": curve})
    return model.eval(), res


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy to the teacher's argmax plus KL to its distribution, half each."""
    s = student_logits.float().flatten(0, -2)
    t = teacher_logits.float().flatten(0, -2)
    hard = F.cross_entropy(s, t.argmax(-1))
    soft = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True,
                    reduction="batchmean")
    return 0.5 * hard + 0.5 * soft


@torch.no_grad()
def agreement(student, teacher, windows: torch.Tensor, device, chunk: int = 16) -> float:
    """Fraction of held-out positions where student and teacher argmax agree."""
    hit, n = 0, 0
    for i in range(0, len(windows), chunk):
        w = windows[i: i + chunk, :-1].to(device)
        with autocast(device):
            a = student(input_ids=w).logits.argmax(-1)
            b = teacher(input_ids=w).logits.argmax(-1)
        hit += int((a == b).sum())
        n += a.numel()
    return hit / n


def distill_draft(p: Preset, target, train: torch.Tensor, held: torch.Tensor, eos_id: int,
                  seed: int, device) -> tuple[torch.nn.Module, StageResult]:
    model = new_model(p.draft, p.vocab_size, eos_id, seed + 10, 0.0, device)
    opt = make_optimizer(model, p.draft_lr, 0.0)
    gen = torch.Generator().manual_seed(seed + 11)
    windows = eval_windows(held, p.eval_windows, p.seq_len)
    t0 = time.perf_counter()
    model.train()
    done = 0
    for step in range(1, p.draft_steps + 1):
        if capped(p, t0):
            break
        done = step
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, p.draft_steps, p.draft_lr, p.warmup)
        x = sample_batch(train, p.batch, p.seq_len, gen, device)[:, :-1]
        with torch.no_grad():  # the teacher in fp32: its argmax is what the engine verifies
            teacher = target(input_ids=x).logits
        with autocast(device):
            logits = model(input_ids=x).logits
        loss = distill_loss(logits, teacher)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % (p.eval_every * 2) == 0 or step == p.draft_steps:
            model.eval()
            agree = agreement(model, target, windows, device)
            model.train()
            log(f"draft step {step}: loss {loss.item():.3f} held-out top-1 agreement {agree:.3f}")
    model.eval()
    agree = agreement(model, target, windows, device)
    return model, StageResult("draft", done, time.perf_counter() - t0,
                              extra={"heldout_top1_agreement": round(agree, 4)})


def train_block(p: Preset, target_dir: Path, out_dir: Path, train: torch.Tensor, mask_id: int,
                seed: int, device) -> StageResult:
    """Distil the block drafter (architecture and loss from the runtime's block module)."""
    from ..runtime.drafters import block as B
    from ..runtime.loader import load_model

    target = load_model(target_dir, device, "float32")
    torch.manual_seed(seed + 20)
    block = B.init_block_drafter(target.cfg, block_size=p.block_size,
                                 num_hidden_layers=p.block_layers, mask_token_id=mask_id,
                                 seed=seed + 20).to(device)
    block.train()
    opt = make_optimizer(block, p.block_lr, 0.0)
    gen = torch.Generator().manual_seed(seed + 21)
    lgen = torch.Generator(device=device).manual_seed(seed + 22)
    t0, losses = time.perf_counter(), []
    done = 0
    for step in range(1, p.block_steps + 1):
        if capped(p, t0):
            break
        done = step
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, p.block_steps, p.block_lr, p.warmup)
        x = sample_batch(train, p.batch, p.seq_len, gen, device)[:, :-1]
        loss = B.block_training_loss(block, target, x, n_blocks=p.block_n, generator=lgen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(block.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % (p.eval_every * 2) == 0 or step == p.block_steps:
            log(f"block step {step}: loss {sum(losses[-50:]) / len(losses[-50:]):.3f}")
    block.eval()
    B.save_block_drafter(block.to(torch.bfloat16), out_dir)
    return StageResult("block", done, time.perf_counter() - t0,
                       extra={"final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4)})


@contextmanager
def staged_dir(path: Path) -> Iterator[Path]:
    """A fresh directory beside `path` to write into; renamed to `path` when the block ends
    without an error (removed if it fails), so `path` is never half-written and an old
    `path` survives until the new one is complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.urandom(4).hex()}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old-{os.urandom(4).hex()}")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(model, path: Path, tok_dir: Path, meta: dict) -> None:
    """bf16 weights in HF layout + the tokenizer files + a training record (staged, then
    renamed into place)."""
    with staged_dir(path) as tmp:
        model = model.to("cpu", torch.bfloat16)
        model.save_pretrained(tmp, safe_serialization=True)
        copy_tokenizer(tok_dir, tmp)
        (tmp / "training.json").write_text(json.dumps(meta, indent=2) + "\n")


def copy_tokenizer(tok_dir: Path, path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, path / name)


def load_hf(path: Path, device):
    import transformers

    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return m.to(device).eval().requires_grad_(False)


def check_stages(out: Path, stages: tuple[str, ...]) -> None:
    """One-line errors for a bad --stages or --out, before anything is created."""
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise SpecPilotError(f"--stages {','.join(stages) or '(empty)'}: use a comma-separated "
                             f"subset of {','.join(STAGES)}")
    if out.exists() and not out.is_dir():
        raise SpecPilotError(f"--out {out} is a file: give a directory")
    need = [out / "target" / f for f in ("config.json", "tokenizer.json")]
    if "target" not in stages and not all(f.is_file() for f in need):
        raise SpecPilotError(f"--stages {','.join(stages)} needs a trained target in "
                             f"{out / 'target'}: add the target stage")


def run(out: Path, preset: Preset, seed: int, device: str, stdlib: str | None,
        stages: tuple[str, ...]) -> list[StageResult]:
    """Run the recipe's stages into `out` ({target,draft,block}/); returns what each did."""
    out = Path(out)
    check_stages(out, stages)
    torch.manual_seed(seed)
    if device == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
    out.mkdir(parents=True, exist_ok=True)
    files = list_files(stdlib)
    train_files = corpus_texts(files, "train")
    held_files = corpus_texts(files, "heldout")
    if preset.max_files:
        train_files = train_files[: preset.max_files]
        held_files = held_files[: max(2, preset.max_files // 8)]
    env = {"python": platform.python_version(), "stdlib": str(stdlib or stdlib_root()),
           "torch": torch.__version__, "device": device, "seed": seed,
           "preset": asdict(preset), "train_files": len(train_files),
           "heldout_files": len(held_files)}
    results: list[StageResult] = []
    t0 = time.perf_counter()
    tok_dir = out / "target"
    if "target" in stages:
        tok = train_tokenizer([t for _, t in train_files], preset.vocab_size)
        tmp_tok = out / ".tokenizer"
        save_tokenizer(tok, tmp_tok)
    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        tmp_tok = tok_dir
    eos_id = tok.token_to_id(EOT)
    train = encode_stream(tok, [t for _, t in train_files], eos_id)
    held = encode_stream(tok, [t for _, t in held_files], eos_id)
    env.update(train_tokens=len(train), heldout_tokens=len(held))
    log(f"corpus: {len(train_files)} train files ({len(train)} tokens), {len(held_files)} "
        f"held-out ({len(held)} tokens), tokenizer+encode {time.perf_counter() - t0:.1f}s")
    results.append(StageResult("tokenizer", 0, time.perf_counter() - t0))
    if "target" in stages:
        model, res = train_target(preset, train, held, eos_id, seed, device)
        save_checkpoint(model, out / "target", tmp_tok, {**env, "stage": asdict(res)})
        shutil.rmtree(tmp_tok)
        results.append(res)
        log(f"target: best held-out loss {res.heldout_loss:.4f} at step {res.best_step}, "
            f"{res.seconds:.0f}s")
    target = None
    if "draft" in stages:
        target = load_hf(out / "target", device)
        model, res = distill_draft(preset, target, train, held, eos_id, seed, device)
        save_checkpoint(model, out / "draft", out / "target", {**env, "stage": asdict(res)})
        results.append(res)
        log(f"draft: {res.extra}, {res.seconds:.0f}s")
    if "block" in stages:
        del target
        with staged_dir(out / "block") as bdir:
            res = train_block(preset, out / "target", bdir, train, tok.token_to_id(MASK), seed,
                              device)
            copy_tokenizer(out / "target", bdir)
            (bdir / "training.json").write_text(json.dumps({**env, "stage": asdict(res)},
                                                           indent=2))
        results.append(res)
        log(f"block: {res.extra}, {res.seconds:.0f}s")
    return results


def main(argv: list[str] | None = None) -> list[StageResult]:
    ap = argparse.ArgumentParser(prog="specpilot zoo train", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="models/tiny-pycode")
    ap.add_argument("--preset", default="full", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stdlib", default=None, help="stdlib root (default: this Python's)")
    ap.add_argument("--stages", default="target,draft,block")
    ap.add_argument("--target-steps", type=int)
    ap.add_argument("--draft-steps", type=int)
    ap.add_argument("--block-steps", type=int)
    ap.add_argument("--max-stage-seconds", type=float)
    a = ap.parse_args(argv)
    preset = PRESETS[a.preset]
    over = {k: v for k, v in (("target_steps", a.target_steps), ("draft_steps", a.draft_steps),
                              ("block_steps", a.block_steps),
                              ("max_stage_seconds", a.max_stage_seconds)) if v is not None}
    for k, v in over.items():
        low = 0 if k == "max_stage_seconds" else 1
        if v < low:
            raise SpecPilotError(f"--{k.replace('_', '-')} must be >= {low}, got {v}")
    preset = replace(preset, **over)
    stages = tuple(s.strip() for s in a.stages.split(",") if s.strip())
    return run(Path(a.out), preset, a.seed, a.device, a.stdlib, stages)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SpecPilotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
