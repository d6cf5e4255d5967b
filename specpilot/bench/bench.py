"""The bench: run a workload through a runner, time it, and record exactly what came out.

`run_bench` does one warm-up batch, then `repeats` measured passes over the workload in
batches of B concurrent requests (greedy). The result JSON holds the environment, the
settings, every request (ids, prompt and output tokens, timings, verify steps, acceptance)
and totals; its outputs are what token forcing checks (`specpilot verify --outputs`).

`bench_command` is `specpilot bench`. An engine directory with a non-empty overlay is
benched in a child process (`python -m specpilot.bench.bench SPEC OUT`) whose PYTHONPATH
holds only the engine's build dir, so the candidate's code is what runs.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.errors import SpecPilotError

FORMAT = "specpilot.bench/1"


@dataclass
class PromptSet:
    """A workload already tokenized: items are dicts with id, dataset and prompt_ids."""

    name: str
    hash: str
    items: list[dict] = field(default_factory=list)


def _get(item, key: str, default=None):
    return item.get(key, default) if isinstance(item, dict) else getattr(item, key, default)


def prompt_ids(item, tokenizer) -> list[int]:
    """An item's prompt as token ids: given ids, or its text encoded by `tokenizer`."""
    ids = _get(item, "prompt_ids")
    if ids:
        return list(ids)
    p = _get(item, "prompt")
    if isinstance(p, list) and p and all(isinstance(t, int) for t in p):
        return list(p)
    if not isinstance(p, str):
        raise SpecPilotError(f"workload item {_get(item, 'id')!r} has no prompt text or ids")
    if tokenizer is None:
        raise SpecPilotError("this workload has text prompts: give --model (for its tokenizer)")
    return tokenizer.encode(p)


def environment(runner, meta: dict | None = None) -> dict:
    import torch

    from .. import __version__
    from ..deployment import ROOT

    try:
        commit = subprocess.run(check=False, args=["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(check=False, args=["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
        commit = commit + ("-dirty" if dirty.strip() else "") if commit else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    env = {"device": runner.device_name, "torch": torch.__version__,
           "python": platform.python_version(), "platform": platform.platform(),
           "cpus": os.cpu_count(), "specpilot": __version__, "git_commit": commit,
           "engine_hash": "", "engine": "", "deployment": ""}
    env.update(meta or {})
    return env


def _progress(enabled: bool, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not (enabled and sys.stderr.isatty()):
        return None
    from rich.console import Console

    p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                 TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    p.add_task("bench", total=total)
    return p


def run_bench(runner, workload, tokenizer, batch: int, max_new_tokens: int,
              limit: int | None = None, repeats: int = 1, progress: bool = False,
              meta: dict | None = None) -> dict:
    """Bench `workload` (anything with name, hash, items) on `runner`; the result JSON."""
    check_ranges(limit=limit, batch=batch, max_new_tokens=max_new_tokens, repeats=repeats)
    items = list(workload.items)[:limit]
    if not items:
        raise SpecPilotError(f"workload {workload.name!r} has no prompts to bench")
    prompts = [prompt_ids(it, tokenizer) for it in items]
    chunks = [list(range(s, min(s + batch, len(items)))) for s in range(0, len(items), batch)]
    runner.generate([prompts[i] for i in chunks[0]], max_new_tokens)  # warm-up batch
    runs: list[list[dict]] = []
    bar = _progress(progress, repeats * len(items))
    if bar:
        bar.start()
    try:
        for _ in range(repeats):
            got: list[dict] = [{} for _ in items]
            for ch in chunks:
                for i, r in zip(ch, runner.generate([prompts[i] for i in ch], max_new_tokens)):
                    got[i] = r
                if bar:
                    bar.advance(bar.task_ids[0], len(ch))
            runs.append(got)
    finally:
        if bar:
            bar.stop()
    stable = all(run[i]["output_ids"] == runs[0][i]["output_ids"]
                 for run in runs for i in range(len(items)))
    requests = []
    for i, it in enumerate(items):
        first = runs[0][i]
        rec = {"id": str(_get(it, "id", i)), "dataset": _get(it, "dataset", "") or "",
               "prompt_ids": prompts[i], "output_ids": first["output_ids"],
               "finish_reason": first["finish_reason"], "new_tokens": first["new_tokens"],
               "verify_steps": first["verify_steps"], "accept_length": first["accept_length"],
               "latency_s": statistics.median(r[i]["latency_s"] for r in runs),
               "time_s": statistics.median(r[i]["time_s"] for r in runs),
               "timings": [{"latency_s": r[i]["latency_s"], "time_s": r[i]["time_s"]}
                           for r in runs]}
        if tokenizer is not None:
            shown = first["output_ids"]
            if first["finish_reason"] == "eos" and shown:
                shown = shown[:-1]  # the EOS token is not part of the answer's text
            rec["output_text"] = tokenizer.decode(shown)
        if isinstance(_get(it, "prompt"), str):
            rec["prompt"] = _get(it, "prompt")
        if _get(it, "reference") is not None:
            rec["reference"] = _get(it, "reference")
        requests.append(rec)
    tokens = sum(r["new_tokens"] for r in requests)
    steps = sum(r["verify_steps"] for r in requests)
    per_rep = [sum(r[i]["new_tokens"] for i in range(len(items)))
               / max(1e-12, sum(r[i]["time_s"] for i in range(len(items)))) for r in runs]
    time_s = sum(r["time_s"] for r in requests)
    return {
        "format": FORMAT,
        "environment": environment(runner, meta),
        "settings": {"workload": {"name": workload.name, "hash": workload.hash},
                     "batch": batch, "max_new_tokens": max_new_tokens, "limit": limit,
                     "repeats": repeats, "warmup": "first batch", "greedy": True,
                     **runner.describe()},
        "requests": requests,
        "totals": {"requests": len(requests), "new_tokens": tokens, "verify_steps": steps,
                   "time_s": time_s, "tokens_per_s": tokens / time_s if time_s else 0.0,
                   "tokens_per_s_per_repeat": per_rep,
                   "accept_length": (sum(r["accept_length"] * r["verify_steps"]
                                         for r in requests) / steps if steps else 0.0),
                   "mean_accept_length": statistics.mean(r["accept_length"] for r in requests),
                   "outputs_stable": stable},
    }


def check_ranges(**flags: int | None) -> None:
    """A one-line error for the first flag out of its range; None means "the default".
    Flags are named as given (max_new_tokens -> --max-new-tokens); k is 1..32 as in Knobs."""
    for name, value in flags.items():
        if value is None:
            continue
        low, high = (1, 32) if name == "k" else (1, None)
        if value < low or (high is not None and value > high):
            want = f"in {low}..{high}" if high is not None else f">= {low}"
            raise SpecPilotError(f"--{name.replace('_', '-')} must be {want}, got {value} "
                                 "(leave it out for the default)")


def check_out_path(path: str | Path, flag: str, suffixes: tuple[str, ...]) -> Path:
    """Raise a one-line error unless `path` can be written, before any work is done: not a
    folder, ending in one of `suffixes` (when given), and its folder (or, where that is still to be
    made, the nearest one above it that exists) a folder this process may write in."""
    p = Path(path)
    if p.is_dir():
        raise SpecPilotError(f"{flag} {p} is a folder: give a file path such as "
                             f"{p / ('result' + (suffixes or ('.json',))[0])}")
    if suffixes and p.suffix.lower() not in suffixes:
        ends = ", ".join(suffixes[:-1]) + " or " if len(suffixes) > 1 else ""
        raise SpecPilotError(f"{flag} {p}: the file name must end in {ends}{suffixes[-1]}")
    folder = p.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise SpecPilotError(f"{flag} {p}: {folder} is not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecPilotError(f"{flag} {p}: cannot write in {folder} (permission denied); "
                             "choose another path")
    return p


def check_flags(deployment: str | None, engine: str | None, model: str | None,
                drafter: str | None, k: int | None, server: str | None, device: str | None,
                dtype: str | None) -> None:
    """A one-line error for a `bench` flag its mode would ignore: --drafter is the engine of
    --model only (a deployment's engine, ar, stock or a folder, fixes its drafter); --k needs
    a drafter and no engine folder (whose engine.toml fixes k, and whose hash the result
    names); a server runs as it was started, so --engine, --drafter, --k, --device and
    --dtype cannot change it."""
    if server:
        given = [f"--{n}" for n, v in (("engine", engine), ("drafter", drafter), ("k", k),
                                        ("device", device), ("dtype", dtype)) if v is not None]
        if given:
            raise SpecPilotError(f"{', '.join(given)} cannot change a --server (it runs as it "
                                 f"was started): leave {'them' if len(given) > 1 else 'it'} out")
        return
    if drafter is not None and not model:
        raise SpecPilotError("--drafter only with --model: a deployment's engine (--engine ar, "
                             "stock or an engine folder) fixes its drafter")
    if k is None:
        return
    if deployment and engine not in (None, "ar", "stock"):
        raise SpecPilotError(f"--k does not apply to engine {engine}: its engine.toml fixes k "
                             "(bench it as it is, or use --engine stock --k N)")
    no_drafter = engine == "ar" if deployment else drafter in (None, "", "none", "ar")
    if no_drafter:
        raise SpecPilotError("--k needs a drafter: the ar engine drafts nothing "
                             + ("(use --engine stock --k N)" if deployment
                                else "(give --drafter too)"))


def write_result(path: str | Path, result: dict) -> None:
    """Atomically (a temporary file beside `path`, then a rename); one-line error if not."""
    from ..atomic import write_json_atomic

    try:
        write_json_atomic(Path(path), result)
    except OSError as e:
        raise SpecPilotError(f"cannot write {path} ({e.strerror or e}); choose another "
                             "--out") from None


def _child_main(spec_path: str, out_path: str) -> None:
    """`python -m specpilot.bench.bench SPEC OUT`: bench a knob set with this package."""
    from ..runtime.knobs import Knobs
    from .runners import LocalRunner

    spec = json.loads(Path(spec_path).read_text())
    runner = LocalRunner(spec["model"], Knobs.from_dict(spec["knobs"]), spec["device"],
                         spec["dtype"], (spec["batch"],))
    wl = PromptSet(spec["workload"]["name"], spec["workload"]["hash"], spec["items"])
    res = run_bench(runner, wl, runner.tokenizer, spec["batch"], spec["max_new_tokens"],
                    spec["limit"], spec["repeats"], progress=False, meta=spec["meta"])
    import specpilot

    res["environment"]["package"] = os.path.dirname(specpilot.__file__)
    write_result(out_path, res)


def bench_in_build(build_path: Path, model: str, knobs, device: str, dtype: str, workload,
                   tokenizer, batch: int, max_new_tokens: int, limit: int | None,
                   repeats: int, meta: dict) -> dict:
    """Run the bench in a child process whose only PYTHONPATH entry is `build_path`."""
    items = [{"id": str(_get(it, "id", i)), "dataset": _get(it, "dataset", "") or "",
              "prompt_ids": prompt_ids(it, tokenizer)}
             for i, it in enumerate(list(workload.items)[:limit])]
    spec = {"model": model, "knobs": knobs.to_dict(), "device": device, "dtype": dtype,
            "workload": {"name": workload.name, "hash": workload.hash}, "items": items,
            "batch": batch, "max_new_tokens": max_new_tokens, "limit": limit,
            "repeats": repeats, "meta": meta}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(build_path)
    with tempfile.TemporaryDirectory(prefix="specpilot-bench-") as tmp:
        sp, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        sp.write_text(json.dumps(spec))
        proc = subprocess.run(check=False, args=[sys.executable, "-s", "-m", "specpilot.bench.bench", str(sp),
                               str(out)], cwd=build_path, env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpecPilotError(f"the engine's bench process failed: {tail[:300]}")
        res = json.loads(out.read_text())
    res["settings"]["workload"] = {"name": workload.name, "hash": workload.hash}
    return res


def load_prompts(name_or_path: str, tokenizer) -> object:
    """A workload by name or file, via the zoo's `load_workload` (or a plain JSONL file of
    {id, dataset, prompt | prompt_ids} records while that module is absent)."""
    try:
        from .workloads import load_workload
    except ImportError:
        load_workload = None
    if load_workload is not None:
        return load_workload(name_or_path, tokenizer)
    import hashlib

    p = Path(name_or_path)
    if not p.is_file():
        raise SpecPilotError(f"no workload file {p}: give a JSONL of prompts")
    raw = p.read_bytes()
    items = [json.loads(x) for x in raw.decode().splitlines() if x.strip()]
    for i, it in enumerate(items):
        it.setdefault("id", str(i))
    return PromptSet(p.stem, hashlib.sha256(raw).hexdigest()[:16], items)


def bench_command(deployment: str | None, engine: str | None, model: str | None,
                  drafter: str | None, k: int | None, workload: str | None, limit: int | None,
                  batch: int | None, max_new_tokens: int | None, server: str | None,
                  repeats: int, out: str, device: str | None, dtype: str | None,
                  progress: bool = True) -> dict:
    """The body of `specpilot bench`: resolve what to run, run it, write --out."""
    from ..deployment import check_device
    from ..runtime.knobs import Knobs
    from ..runtime.tokenizer import Tokenizer
    from .runners import LocalRunner, ServerRunner

    check_ranges(limit=limit, batch=batch, max_new_tokens=max_new_tokens, k=k, repeats=repeats)
    check_out_path(out, "--out", ())
    check_flags(deployment, engine, model, drafter, k, server, device, dtype)
    if device is not None:
        check_device(device)
    meta: dict = {}
    build = None
    if deployment:
        from ..deployment import load_deployment

        dep = load_deployment(deployment)
        if model:
            raise SpecPilotError("give either --deployment or --model, not both")
        model, device, dtype = dep.target, device or dep.device, dtype or dep.dtype
        workload = workload or dep.dev_workload
        max_new_tokens = max_new_tokens if max_new_tokens is not None else dep.max_new_tokens
        batch = batch if batch is not None else dep.batch_sizes[0]
        engine = engine or "stock"
        meta["deployment"] = dep.name
        if engine == "ar":
            knobs = dep.knobs.with_(drafter=None)
        elif engine == "stock":
            knobs = dep.stock_knobs()
        else:
            from .. import engines

            if not Path(engine).exists():
                raise SpecPilotError(f"no engine {engine!r}: give ar or stock (the built-in "
                                     f"engines) or an engine folder, e.g. engines/{dep.name}/final")
            loaded = engines.load_engine(engine)
            if loaded.spec.deployment != dep.name:
                raise SpecPilotError(f"engine {engine} was made for deployment "
                                     f"{loaded.spec.deployment!r}, not {dep.name!r}: bench it "
                                     f"with --deployment {loaded.spec.deployment}")
            knobs = loaded.spec.knobs
            meta["engine_hash"] = loaded.spec.hash
            if loaded.spec.overlay:
                build = engines.build(loaded.spec).path
        meta["engine"] = engine
        if k is not None:
            knobs = knobs.with_(k=k)
        if engine in ("ar", "stock"):
            try:
                from ..engines import content_hash

                meta["engine_hash"] = content_hash(knobs, {})
            except ImportError:
                pass
    elif model:
        if engine:
            raise SpecPilotError("--engine needs --deployment")
        knobs = Knobs(drafter=None if drafter in (None, "", "none", "ar") else drafter,
                      **({"k": k} if k is not None else {}))
        meta["engine"] = "ar" if knobs.drafter is None else knobs.drafter
    elif not server:
        raise SpecPilotError("give --deployment NAME --engine ar|stock|PATH, --model DIR, "
                             "or --server URL")
    if not workload:
        raise SpecPilotError("give --workload NAME|FILE" + (" (the deployment names none)"
                                                           if deployment else ""))
    device, dtype = device or "cpu", dtype or "float32"
    batch = batch if batch is not None else 1
    max_new_tokens = max_new_tokens if max_new_tokens is not None else 128
    tokenizer = Tokenizer(model) if model and not str(model).startswith("random:") else None
    wl = load_prompts(workload, tokenizer)
    if server:
        runner = ServerRunner(server)
        meta.setdefault("engine", "server")
        res = run_bench(runner, wl, tokenizer, batch, max_new_tokens, limit, repeats,
                        progress, meta)
        runner.close()
    elif build is not None:
        res = bench_in_build(build, model, knobs, device, dtype, wl, tokenizer, batch,
                             max_new_tokens, limit, repeats, meta)
    else:
        runner = LocalRunner(model, knobs, device, dtype, (batch,))
        res = run_bench(runner, wl, tokenizer, batch, max_new_tokens, limit, repeats,
                        progress, meta)
    write_result(out, res)
    return res


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
