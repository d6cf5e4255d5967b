"""Time several built engines on the same prompts in alternation, chunk by chunk.

A machine's speed drifts (other processes, clock frequency, a neighbour on the host): two
engines timed one after the other, tens of seconds apart, can differ by more than the
effect a search looks for. Here, every round, every engine is loaded in a process of its
own (`worker --serve`, with its build first on PYTHONPATH); then each chunk of prompts
(one batch) is run by every engine in turn, so all engines meet the same machine within
seconds of each other and a paired comparison of their per-request times cancels the
drift. The order is drawn at random for every chunk: an engine runs faster right after one
that executes the same code (the shared libraries' code is then warm in the CPU caches;
identical engines measured 1.06x apart when one always followed the other). Fresh
processes every round average out each process's own speed. One engine runs at a time:
the others wait on their pipes. An engine that crashes, raises or hangs is dropped with
its reason; the others go on.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..engines import build_env
from .evaluate import EvalResult


@dataclass
class Entrant:
    name: str
    hash: str
    build_path: str  # the folder holding the engine's specpilot package
    knobs: dict


@dataclass
class Timed:
    """One engine's interleaved timing: the units (median over rounds) and its outputs."""

    result: EvalResult
    records: list[dict] = field(default_factory=list)  # distinct (prompt, output) pairs
    stable: bool = True  # the same outputs in every round


class EngineProcess:
    """A `worker --serve` process: one engine, loaded once, answering timing commands."""

    def __init__(self, e: Entrant, target: str, device: str, dtype: str, tmp: Path,
                 limit_s: float, batch_sizes: list[int]):
        self.name, self.limit_s, self.error, self._buf = e.name, limit_s, "", b""
        req = tmp / f"{e.name}.json"
        req.write_text(json.dumps({"target": target, "knobs": e.knobs, "device": device,
                                   "dtype": dtype, "batch_sizes": list(batch_sizes)}))
        self.log = tmp / f"{e.name}.log"
        threads = os.environ.get("OMP_NUM_THREADS", "1")  # as `evaluate.run_worker`
        with open(self.log, "w") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-s", "-m", "specpilot.agents.worker", "--serve", str(req)],
                cwd=e.build_path, env=build_env(Path(e.build_path), {"OMP_NUM_THREADS": threads}),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                start_new_session=True)
        self._reply()  # "ready" once the engine is loaded

    @property
    def alive(self) -> bool:
        return not self.error

    def call(self, prompts: list[list[int]], max_new_tokens: int) -> list[dict] | None:
        if not self.alive:
            return None
        try:
            self.proc.stdin.write((json.dumps({"prompts": prompts,
                                               "max_new_tokens": max_new_tokens}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self._fail("crashed")
            return None
        rep = self._reply()
        return rep.get("results") if rep else None

    def _reply(self) -> dict | None:
        deadline = time.monotonic() + self.limit_s
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    self._fail(f"timed out after {self.limit_s:.0f} s (hang)")
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self._fail("crashed")
                    return None
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        rep = json.loads(line)
        if not rep.get("ok"):
            self._fail(f"raised: {rep.get('error', '')}")
            return None
        return rep

    def _fail(self, why: str) -> None:
        self.proc.poll()
        if why == "crashed":
            tail = [x for x in self.log.read_text().splitlines() if x.strip()]
            why = f"crashed (exit {self.proc.returncode}): {(tail[-1] if tail else '')[:300]}"
        self.error = why
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"quit": true}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def interleaved(entrants: list[Entrant], target: str, device: str, dtype: str,
                prompts: list[list[int]], batch_sizes: list[int], max_new_tokens: int,
                rounds: int = 2, limit_s: float = 600.0, seed: int = 0) -> dict[str, Timed]:
    """Time every entrant on `prompts` at each batch size, `rounds` times, alternating
    engines chunk by chunk in a fresh seeded random order for every chunk. Each round
    starts every engine in a new process (and runs one untimed warm-up chunk per batch
    size): a process has a speed of its own (memory placement), which a single process
    would turn into a bias. Units and their order are `EvalResult`'s: (batch size,
    request) pairs, per batch size in request order, each the median over the rounds."""
    import tempfile

    times: dict[str, dict[tuple[int, int], list[float]]] = {e.name: {} for e in entrants}
    first: dict[str, dict[tuple[int, int], dict]] = {e.name: {} for e in entrants}
    stable = {e.name: True for e in entrants}
    errors: dict[str, str] = {}
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="specpilot-interleave-") as tmp:
        for _ in range(rounds):
            procs: list[EngineProcess] = []
            try:
                for e in entrants:
                    if e.name not in errors:
                        procs.append(EngineProcess(e, target, device, dtype, Path(tmp),
                                                   limit_s, batch_sizes))
                for b in batch_sizes:  # warm-up: the first chunk of each batch size
                    for p in procs:
                        p.call(prompts[:b], max_new_tokens)
                for b in batch_sizes:
                    for s in range(0, len(prompts), b):
                        for p in rng.sample(procs, len(procs)):
                            got = p.call(prompts[s:s + b], max_new_tokens)
                            for i, r in enumerate(got or []):
                                unit = (b, s + i)
                                times[p.name].setdefault(unit, []).append(float(r["time_s"]))
                                seen = first[p.name].setdefault(unit, r)
                                stable[p.name] &= seen["output_ids"] == r["output_ids"]
            finally:
                for p in procs:
                    p.close()
                    if p.error:
                        errors[p.name] = p.error
    out = {}
    for e in entrants:
        res = EvalResult(cid=e.name, hash=e.hash, ok=e.name not in errors,
                         reason=errors.get(e.name, ""))
        records, keys = [], set()
        if res.ok:
            for b in batch_sizes:
                for i, prompt in enumerate(prompts):
                    r = first[e.name][(b, i)]
                    res.time_s.append(statistics.median(times[e.name][(b, i)]))
                    res.tokens.append(int(r["new_tokens"]))
                    res.steps.append(int(r["verify_steps"]))
                    res.batch.append(int(b))
                    key = (tuple(prompt), tuple(r["output_ids"]))
                    if key not in keys:
                        keys.add(key)
                        records.append({"prompt_ids": prompt, "output_ids": r["output_ids"],
                                        "finish_reason": r["finish_reason"]})
        out[e.name] = Timed(res, records, stable[e.name])
    return out
