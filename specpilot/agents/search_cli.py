"""The bodies of `specpilot search`, `replay` and `runs list` (cli.py stays thin)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from ..runtime.errors import SpecPilotError


def search_command(deployment: str, budget: int, time_limit: float, agents: str,
                   llm: str | None, llm_base_url: str | None, replay_from: str | None,
                   workers: int, ray_address: str | None, run_id: str | None,
                   resume: str | None, seed: int, per_round: int, repeats: int,
                   dev_limit: int, eval_timeout: float, no_promote: bool,
                   quiet: bool) -> dict:
    from .loop import Search, SearchConfig
    from .progress import SearchProgress

    if run_id and resume:
        raise SpecPilotError("give --run-id ID or --resume ID, not both")
    if not deployment and not resume:
        raise SpecPilotError("give --deployment NAME (or --resume RUN_ID)")
    kinds = tuple(a.strip() for a in agents.split(",") if a.strip())
    if llm and "llm" not in kinds:
        kinds += ("llm",)
    cfg = SearchConfig(deployment=deployment or "", budget=budget, time_limit_min=time_limit,
                       agents=kinds, llm=llm, llm_base_url=llm_base_url,
                       replay_from=replay_from, workers=workers, ray_address=ray_address,
                       run_id=resume or run_id, resume=bool(resume), seed=seed,
                       per_round=per_round, repeats=repeats, dev_limit=dev_limit,
                       gate_limit=dev_limit, eval_time_limit_s=eval_timeout,
                       promote=not no_promote)
    s = Search(cfg)
    with SearchProgress(s.run_id, enabled=not quiet) as prog:
        s.on_event = prog.on_event
        res = s.run()
    sp = res["speedup_vs_stock"]
    ar = res["speedup_vs_ar"]
    Console().print(
        f"run {s.run_id}: final = {res['engine']}, {sp['ratio']:.2f}x vs stock "
        f"(CI95 {sp['ci95'][0]:.2f}-{sp['ci95'][1]:.2f}), {ar['ratio']:.2f}x vs ar; "
        f"gate {'passed' if res['gate']['verified'] else 'FAILED'}")
    return res


def replay_command(engine_dir: str, json_out: bool, rounds: int, dev_limit: int) -> int:
    from ..engines import replay

    res = replay(engine_dir, rounds=rounds, dev_limit=dev_limit, gate_limit=dev_limit)
    if json_out:
        print(json.dumps(res, indent=1))
    else:
        c = Console()
        c.print(f"{res['engine']}: hash {'matches' if res['hash_matches'] else 'DIFFERS'}, "
                f"{'verified' if res['verified'] else 'NOT verified'} on dev and gate"
                + (f" ({res['reason']})" if res["reason"] else ""))
        for ref in ("stock", "ar"):
            s = res[f"speedup_vs_{ref}"]
            if s["ratio"] is not None:
                c.print(f"  vs {ref}: {s['ratio']:.2f}x  CI95 [{s['ci95'][0]:.2f}, "
                        f"{s['ci95'][1]:.2f}]  ({res['tok_s']:.1f} vs {s['tok_s']:.1f} tok/s)")
    return 0 if res["hash_matches"] and res["verified"] else 1


def runs_list_command() -> None:
    from ..trace import list_runs

    t = Table(title="runs")
    for col in ("run", "deployment", "evaluations", "finished", "best", "vs stock"):
        t.add_column(col)
    for r in list_runs():
        sp = f"{r.best_speedup:.2f}x" if r.best_speedup else "-"
        t.add_row(r.run_id, r.deployment, str(r.evaluations), "yes" if r.finished else "no",
                  r.best or "-", sp)
    Console().print(t)
