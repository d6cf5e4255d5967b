"""Engines: build a candidate (stock runtime + overlay), hash it, promote it, load it back.

An engine is plain data (`EngineSpec`): the deployment, the knobs and an *overlay* (files
that replace files of the stock `specpilot` package, keyed by their path in the repo, e.g.
`specpilot/runtime/generate.py`). `build` materialises it as a full copy of the package
under `data_dir()/builds/<hash>/`; a worker process that puts that folder first on its
PYTHONPATH runs the candidate's code and nothing else (`run_in_build` starts such a
process under a time limit). `promote` writes
`engines/<deployment>/<name>/` (engine.toml, overlay/, results.json); `load_engine` reads
it back; `replay` rebuilds a shipped engine, re-verifies and re-benches it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path

from . import __version__
from .deployment import ROOT, data_dir
from .runtime.errors import SpecPilotError, check_dir, missing_key
from .runtime.knobs import Knobs

PACKAGE = Path(__file__).resolve().parent  # the stock specpilot package
#: folders of the package whose code makes up the "stock runtime" in the engine hash
RUNTIME_DIRS = ("runtime", "kernels")
#: repo path prefixes an overlay may touch (the runtime; the harness never)
OVERLAY_DIRS = tuple(f"specpilot/{d}/" for d in RUNTIME_DIRS)
TUNED_DIR = "specpilot/kernels/tuned/"


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is: knobs plus overlay files on top of the stock runtime."""

    deployment: str
    name: str
    knobs: Knobs
    overlay: dict[str, str] = field(default_factory=dict)  # repo path -> file text
    parents: tuple[str, ...] = ()
    run_id: str = ""
    backend: str = "native"

    @cached_property
    def hash(self) -> str:
        return content_hash(self.knobs, self.overlay)


@dataclass(frozen=True)
class Build:
    """A materialised engine: `path` goes first on PYTHONPATH to run its code."""

    path: Path
    hash: str


@cache
def stock_runtime_hash() -> str:
    """sha256 over the stock runtime's source files (and shipped kernel tables) and the
    package version (read once per process, so one run sees one stock runtime)."""
    h = hashlib.sha256(f"specpilot {__version__}\n".encode())
    for d in RUNTIME_DIRS:
        files = [*(PACKAGE / d).rglob("*.py"), *(PACKAGE / d).rglob("tuned/*.json")]
        for f in sorted(files):
            h.update(f"{f.relative_to(PACKAGE).as_posix()}\n".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@cache
def package_hash() -> str:
    """sha256 over every source file of the installed package: a build copies the whole
    package (harness included), so a cached build is reused only while this is unchanged."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE.rglob("*")):
        if f.is_file() and f.suffix in (".py", ".json"):
            h.update(f"{f.relative_to(PACKAGE).as_posix()}\n".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def portable_knobs(knobs: Knobs) -> dict:
    """Knobs as a dict whose drafter path is relative to the project root when inside it."""
    d = knobs.to_dict()
    if d["drafter"] and ":" in d["drafter"]:
        kind, _, path = d["drafter"].partition(":")
        p = Path(path)
        if p.is_absolute():
            try:
                path = p.resolve().relative_to(ROOT.resolve()).as_posix()
            except ValueError:
                pass
        d["drafter"] = f"{kind}:{path}"
    return d


def resolve_knobs(d: dict) -> Knobs:
    """The inverse of `portable_knobs`: relative drafter paths resolve against the root."""
    d = dict(d)
    drafter = d.get("drafter")
    if drafter and ":" in drafter:
        kind, _, path = drafter.partition(":")
        if not Path(path).is_absolute():
            d["drafter"] = f"{kind}:{ROOT / path}"
    return Knobs.from_dict(d)


def content_hash(knobs: Knobs, overlay: dict[str, str]) -> str:
    """sha256 over the effective knobs' canonical JSON (`Knobs.effective`: knobs that
    change nothing do not make another engine) + overlay files + the stock runtime hash (16
    hex)."""
    h = hashlib.sha256()
    h.update(json.dumps(portable_knobs(knobs.effective()), sort_keys=True,
                        separators=(",", ":")).encode())
    for path in sorted(overlay):
        h.update(f"\0{path}\0".encode())
        h.update(overlay[path].encode())
    h.update(stock_runtime_hash().encode())
    return h.hexdigest()[:16]


def is_tuned_table(path: str) -> bool:
    """A per-device kernel table (`specpilot/kernels/tuned/<device>.json`): data an overlay
    may add as well as replace."""
    return path.startswith(TUNED_DIR) and path.endswith(".json") and \
        "/" not in path[len(TUNED_DIR):]


def check_overlay_paths(overlay: dict[str, str]) -> None:
    """Overlay files must replace files of the stock runtime or kernels (never the harness:
    bench/, forcing/, agents/ ...); a kernel tuning table may also be a new file."""
    for path in overlay:
        p = Path(path)
        if p.is_absolute() or ".." in p.parts or not path.startswith(OVERLAY_DIRS):
            raise SpecPilotError(f"overlay path {path!r} is outside {' and '.join(OVERLAY_DIRS)}: "
                                 "an engine may only change the runtime and its kernels")
        if not is_tuned_table(path) and not (PACKAGE.parent / p).is_file():
            raise SpecPilotError(f"overlay path {path!r} is not a file of the stock package")


def build(spec: EngineSpec, root: Path | None = None) -> Build:
    """Copy the stock package to `<root>/<hash>/specpilot` and write the overlay over it.

    Idempotent: a finished build (marked by `.complete`, which records the package it was
    copied from) is reused while the installed package is the same; else it is rebuilt
    (the engine hash covers the runtime only, the copy holds the harness too)."""
    check_overlay_paths(spec.overlay)
    digest = spec.hash
    root = root or data_dir() / "builds"
    dest = root / digest
    done = dest / ".complete"
    if done.is_file() and done.read_text() == f"{digest} {package_hash()}":
        return Build(dest, digest)
    tmp = root / f".{digest}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(PACKAGE, tmp / "specpilot",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path, text in spec.overlay.items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_text(text)
    (tmp / "engine.json").write_text(json.dumps(
        {"hash": digest, "knobs": portable_knobs(spec.knobs), "overlay": sorted(spec.overlay)},
        indent=1))
    mark = f"{digest} {package_hash()}"
    (tmp / ".complete").write_text(mark)
    if done.is_file() and done.read_text() != mark:  # copied from another package: replace
        stale = root / f".{digest}.{os.getpid()}.stale"
        with contextlib.suppress(OSError):  # another process may be replacing it too
            dest.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.rename(dest)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    return Build(dest, digest)


def build_env(build_path: Path, env: dict | None = None) -> dict:
    """This process's environment with only `build_path` on PYTHONPATH (plus `env`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (env or {})
    env["PYTHONPATH"] = str(build_path)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_in_build(build_path: Path, module: str, args: list[str], log: Path,
                 time_limit_s: float | None = None, env: dict | None = None) -> int | None:
    """Run `python -m module args` with only `build_path` on PYTHONPATH (so the engine's
    code, not the stock package, is imported), output to `log`, in a session of its own;
    its exit code, or None when it ran past `time_limit_s` (its whole group is killed).
    `env` adds to (or overrides) this process's environment."""
    with open(log, "w") as logf:
        proc = subprocess.Popen([sys.executable, "-s", "-m", module, *args], cwd=build_path,
                                env=build_env(build_path, env), stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


# --- engine.toml -----------------------------------------------------------------------

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        items = (f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items())
        return "{" + ", ".join(items) + "}"
    if v is None:
        return '""'
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def engine_toml(spec: EngineSpec) -> str:
    knobs = portable_knobs(spec.knobs)
    lines = [
        f"deployment = {_toml_value(spec.deployment)}",
        f"name = {_toml_value(spec.name)}",
        f"backend = {_toml_value(spec.backend)}",
        f"run_id = {_toml_value(spec.run_id)}",
        f"hash = {_toml_value(spec.hash)}",
        f"stock_runtime = {_toml_value(stock_runtime_hash())}",
        f"specpilot_version = {_toml_value(__version__)}",
        f"parents = {_toml_value(list(spec.parents))}",
        f"overlay = {_toml_value(sorted(spec.overlay))}",
        "",
        "[knobs]",
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in knobs.items()]
    return "\n".join(lines) + "\n"


def promote(spec: EngineSpec, results: dict, engines_root: Path | None = None) -> Path:
    """Write `engines/<deployment>/<name>/` (replacing what was there) and return it."""
    engines_root = engines_root or ROOT / "engines"
    dest = engines_root / spec.deployment / spec.name
    tmp = dest.with_name(f".{spec.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "overlay").mkdir(parents=True)
    for path, text in spec.overlay.items():
        f = tmp / "overlay" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (tmp / "engine.toml").write_text(engine_toml(spec))
    (tmp / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


@dataclass(frozen=True)
class LoadedEngine:
    spec: EngineSpec
    recorded_hash: str
    results: dict
    path: Path

    @property
    def hash_matches(self) -> bool:
        return self.spec.hash == self.recorded_hash


def load_engine(path: str | Path) -> LoadedEngine:
    """Read `engines/<deployment>/<name>/` back into an EngineSpec."""
    path = Path(path)
    if path.name == "engine.toml" and path.is_file():
        raise SpecPilotError(f"{path}: give the engine's folder ({path.parent}), not its "
                             "engine.toml")
    f = check_dir(path, "engine folder", "give engines/DEPLOYMENT/NAME") / "engine.toml"
    if not f.is_file():
        raise SpecPilotError(f"{path} is not an engine (no engine.toml): "
                             "give engines/DEPLOYMENT/NAME")
    try:
        d = tomllib.loads(f.read_text())
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as e:
        raise SpecPilotError(f"{f}: bad engine ({type(e).__name__}: {e})") from None
    gone = [p for p in d.get("overlay", []) if not (path / "overlay" / p).is_file()]
    if gone:
        raise SpecPilotError(f"{f}: overlay file {path / 'overlay' / gone[0]} is missing: "
                             "restore it from git or re-ship the engine")
    try:
        overlay = {p: (path / "overlay" / p).read_text() for p in d.get("overlay", [])}
        spec = EngineSpec(deployment=d["deployment"], name=d["name"],
                          knobs=resolve_knobs(d["knobs"]), overlay=overlay,
                          parents=tuple(d.get("parents", [])), run_id=d.get("run_id", ""),
                          backend=d.get("backend", "native"))
    except KeyError as e:
        raise missing_key(str(f), e) from None
    except SpecPilotError as e:  # a bad knob: name the file that holds it
        raise SpecPilotError(f"{f}: {e}") from None
    except OSError as e:
        raise SpecPilotError(f"cannot read {e.filename} ({e.strerror}): check its "
                             "permissions") from None
    rf = path / "results.json"
    try:
        results = json.loads(rf.read_text()) if rf.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecPilotError(f"{rf}: unreadable engine results ({type(e).__name__}): restore "
                             "it from git or re-ship the engine") from None
    if not isinstance(results, dict):
        raise SpecPilotError(f"{rf}: engine results must be a JSON object: restore it from git "
                             "or re-ship the engine")
    return LoadedEngine(spec, d.get("hash", ""), results, path)


# --- replay ----------------------------------------------------------------------------

def replay(path: str | Path, rounds: int = 2, dev_limit: int | None = 8,
           gate_limit: int | None = 8, time_limit_s: float = 600.0) -> dict:
    """Rebuild a shipped engine, check its hash, verify it on dev and gate, and time it
    against the deployment's stock and ar engines in the same run, interleaved chunk by
    chunk as the search's confirmation does (`agents.interleave`)."""
    from .agents.evaluate import EvalRequest, EvaluatorCore, force, rejection, speedup
    from .agents.inputs import load_prompts
    from .agents.interleave import Entrant, interleaved
    from .deployment import load_deployment
    from .runtime.tokenizer import Tokenizer

    if rounds < 1:
        raise SpecPilotError(f"--rounds must be >= 1, got {rounds}")
    eng = load_engine(path)
    dep = load_deployment(eng.spec.deployment)
    tok = Tokenizer(dep.target)
    dev = load_prompts(dep.dev_workload, tok, dev_limit)
    gate = load_prompts(dep.gate_workload, tok, gate_limit)
    specs = {"engine": eng.spec,
             "stock": EngineSpec(dep.name, "stock", dep.stock_knobs()),
             "ar": EngineSpec(dep.name, "ar", dep.knobs.with_(drafter=None))}
    builds = {name: build(spec) for name, spec in specs.items()}
    timed = interleaved([Entrant(n, s.hash, str(builds[n].path), s.knobs.to_dict())
                         for n, s in specs.items()], dep.target, dep.device, dep.dtype, dev,
                        list(dep.batch_sizes), dep.max_new_tokens, rounds=rounds,
                        limit_s=time_limit_s)
    r = timed["engine"].result
    core = EvaluatorCore(dep.target, dep.device, dep.dtype)
    try:
        if r.ok:
            r.verdict = force(core.reference, timed["engine"].records, dep.max_new_tokens)
            r.verified = r.verdict["passed"]
            req = EvalRequest(cid="engine", hash=eng.spec.hash,
                              build_path=str(builds["engine"].path), target=dep.target,
                              device=dep.device, dtype=dep.dtype,
                              knobs=eng.spec.knobs.to_dict(), batch_sizes=list(dep.batch_sizes),
                              max_new_tokens=dep.max_new_tokens, prompts=[],
                              gate_prompts=gate, time_limit_s=time_limit_s)
            g = core.evaluate(req, with_gate=True)
            r.gate_verdict, r.gate_verified = g.gate_verdict, g.gate_verified
            r.reason = g.reason if not g.ok else rejection(r, timed["engine"].stable, True, True)
    finally:
        core.close()
    out = {"engine": str(eng.path), "deployment": dep.name, "hash": eng.spec.hash,
           "recorded_hash": eng.recorded_hash, "hash_matches": eng.hash_matches,
           "verified": bool(r.ok and r.verified and r.gate_verified and not r.reason),
           "dev_verdict": r.verdict, "gate_verdict": r.gate_verdict, "reason": r.reason,
           "tok_s": r.tok_s, "accept_length": r.accept_length,
           "measured": f"interleaved with stock and ar, chunk by chunk, {rounds} rounds"}
    for ref in ("stock", "ar"):
        base = timed[ref].result
        if r.ok and base.ok:
            ratio, ci = speedup(base, r)
            out[f"speedup_vs_{ref}"] = {"ratio": ratio, "ci95": list(ci), "tok_s": base.tok_s}
        else:
            out[f"speedup_vs_{ref}"] = {"ratio": None, "ci95": None,
                                        "reason": base.reason or r.reason}
    return out
