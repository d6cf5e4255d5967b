"""Proposers and their guards: edits, static checks, heuristic, merge, replay, kernel."""

from __future__ import annotations

import pytest

from specpilot.agents.candidate import (
    Candidate,
    Edit,
    PatchError,
    ProposalContext,
    materialize,
    stock_file,
)
from specpilot.agents.checks import check_edit_paths, check_overlay
from specpilot.agents.heuristic import HeuristicAgent
from specpilot.agents.kernel import KernelAgent
from specpilot.agents.merge import Lineage, MergeConflict, merge3, merge_knobs, merge_overlays
from specpilot.agents.replay import ReplayAgent
from specpilot.runtime.knobs import Knobs
from specpilot.trace import Trace
from tests.fixtures.search_env import PRED, indent_of, statement

GEN = "specpilot/runtime/generate.py"
NGRAM = "specpilot/runtime/drafters/ngram.py"


def line_with(path: str, *needles: str) -> str:
    return next(x for x in stock_file(path).splitlines(keepends=True)
                if all(n in x for n in needles))


def ctx(**kw) -> ProposalContext:
    base = {"deployment": "t", "device": "cpu", "batch_sizes": [1], "drafters": ["draft:/m/d"],
                "round": 0, "best_id": "stock", "best_knobs": Knobs(drafter="draft:/m/d").to_dict(),
                "best_overlay": {}, "best_k": {1: 6}, "n": 4, "seed": 0}
    return ProposalContext(**{**base, **kw})


def test_edits_apply_or_fail_loudly():
    line = line_with(NGRAM, 'name = "ngram"')
    c = Candidate("c1", "t", {"k": 6}, (Edit(NGRAM, line, line.replace("ngram", "ng2")),))
    knobs, overlay = materialize(c, Knobs(drafter="ngram"), {})
    assert knobs.k == 6 and 'name = "ng2"' in overlay[NGRAM]
    with pytest.raises(PatchError, match="not found"):
        materialize(Candidate("c", "t", edits=(Edit(NGRAM, "nope\n", "x"),)), Knobs(), {})
    with pytest.raises(PatchError, match="matches"):
        materialize(Candidate("c", "t", edits=(Edit(NGRAM, "self", "x"),)), Knobs(), {})
    with pytest.raises(PatchError, match="not a file"):
        materialize(Candidate("c", "t", edits=(Edit("specpilot/../x.py", "a", "b"),)), Knobs(), {})
    # an edit undone is no overlay at all
    back = Candidate("c", "t", edits=(Edit(NGRAM, 'name = "ng2"', 'name = "ngram"'),))
    assert materialize(back, Knobs(), overlay)[1] == {}


def test_static_checks_reject_cheats():
    assert check_edit_paths(["specpilot/forcing/verify.py", "specpilot/bench/bench.py",
                             "specpilot/runtime/knobs.py", GEN]) and \
        len(check_edit_paths(["specpilot/forcing/verify.py", GEN])) == 1
    text = stock_file(GEN)
    argmax = statement(GEN, PRED, last=True)
    ind = indent_of(argmax)

    def problems(new_line: str) -> list[str]:
        return check_overlay({GEN: text.replace(argmax, argmax + ind + new_line + "\n", 1)})

    assert problems("pred = pred.clone()") == []
    assert "timing" in problems("t_x = time.perf_counter()")[0]
    assert "synchronisation" in problems("torch.cuda.synchronize()")[0]
    assert "streams" in problems("s = torch.cuda.Stream()")[0]
    assert "process" in problems("import os")[0]
    assert "harness" in problems("from specpilot.forcing import verify")[0]
    assert "compile" in problems("pred = (")[-1]
    tried = text.replace(argmax, f"{ind}try:\n{ind}    {argmax.strip()}\n{ind}except Exception:\n"
                                 f"{ind}    pass\n", 1)
    assert any("try/except" in p for p in check_overlay({GEN: tried}))
    # removing the engine's own timing is as forbidden as adding some
    t0 = line_with(GEN, "perf_counter")
    assert "timing" in check_overlay({GEN: text.replace(t0, "", 1)})[0]


def test_heuristic_is_deterministic_guided_and_skips_tried():
    a, b = HeuristicAgent(seed=1), HeuristicAgent(seed=1)
    pa, _ = a.propose(ctx())
    assert [c.knobs for c in pa] == [c.knobs for c in b.propose(ctx())[0]]
    assert pa[0].knobs == {"k": 6}  # the cost model's predicted best k comes first
    assert all(c.parents == ("stock",) and c.agent == "heuristic" for c in pa)
    tried = [{"knobs_full": {**ctx().best_knobs, **c.knobs}} for c in pa]
    pc, _ = a.propose(ctx(history=tried))
    assert not {str(c.knobs) for c in pc} & {str(c.knobs) for c in pa}
    ng, _ = a.propose(ctx(best_knobs=Knobs(drafter="ngram").to_dict(), n=20))
    assert any("ngram_max" in c.knobs for c in ng)
    multi, _ = a.propose(ctx(batch_sizes=[1, 4], n=20))
    assert any("k_per_batch" in c.knobs for c in multi)
    assert any(c.knobs.get("threads") for c in multi)
    assert not any(set(c.knobs) & {"gemv", "weights", "cuda_graphs"} for c in multi)
    gpu, _ = a.propose(ctx(device="cuda", n=40))
    flips = {k: v for c in gpu for k, v in c.knobs.items()}
    assert flips.get("gemv") == "cublas" and flips.get("weights") == "w12"
    assert flips.get("cuda_graphs") is False and "threads" not in flips


def test_heuristic_keeps_k_within_the_block_drafters_limit(tmp_path):
    import json

    block = tmp_path / "block"
    block.mkdir()
    (block / "config.json").write_text(json.dumps({"block_size": 4}))  # at most 3 drafts
    spec = f"block:{block}"
    c = ctx(drafters=[spec, "draft:/m/d"], best_knobs=Knobs(drafter=spec, k=2).to_dict(),
            best_k={1: 6}, n=50)
    got, _ = HeuristicAgent(seed=0).propose(c)
    ks = [x.knobs["k"] for x in got if "k" in x.knobs]
    assert ks and max(ks) == 3 and 1 in ks  # k 2 -> 3 and 1; never the predicted 6 or 4
    multi, _ = HeuristicAgent(seed=0).propose(ctx(
        drafters=[spec], batch_sizes=[1, 4], n=50,
        best_knobs=Knobs(drafter=spec, k=3, k_per_batch={4: 2}).to_dict(), best_k={1: 5, 4: 3}))
    per = [x.knobs["k_per_batch"] for x in multi if "k_per_batch" in x.knobs]
    assert per and all(v <= 3 for d in per for v in d.values())
    # switching to the block drafter from a draft model at k=8 brings k down with it
    sw, _ = HeuristicAgent(seed=0).propose(ctx(drafters=["draft:/m/d", spec], n=50,
                                               best_knobs=Knobs(drafter="draft:/m/d", k=8)
                                               .to_dict()))
    to_block = [x.knobs for x in sw if x.knobs.get("drafter") == spec]
    assert to_block == [{"drafter": spec, "k": 3}]
    assert all(x.knobs.get("k", 0) <= 16 for x in sw)


def test_three_way_merge_of_disjoint_edits_and_conflicts():
    base = "".join(f"line {i}\n" for i in range(10))
    a = base.replace("line 1\n", "line one\n")
    b = base.replace("line 8\n", "line eight\n")
    m = merge3(base, a, b)
    assert "line one" in m and "line eight" in m and m.count("\n") == 10
    with pytest.raises(MergeConflict):
        merge3(base, a, base.replace("line 1\n", "line uno\n"))
    with pytest.raises(MergeConflict):  # adjacent regions count as a conflict
        merge3(base, a, base.replace("line 2\n", "line two\n"))
    assert merge3(base, a, a) == a
    k0 = Knobs().to_dict()
    assert merge_knobs(k0, {**k0, "k": 6}, {**k0, "threads": 1}) == {**k0, "k": 6, "threads": 1}
    with pytest.raises(MergeConflict, match="knob k"):
        merge_knobs(k0, {**k0, "k": 6}, {**k0, "k": 2})


def test_merge_overlays_on_a_real_file():
    text = stock_file(GEN)
    lines = text.splitlines(keepends=True)
    i, j = 3, len(lines) - 3
    a = "".join(lines[:i] + ["# a\n"] + lines[i + 1:])
    b = "".join(lines[:j] + ["# b\n"] + lines[j + 1:])
    m = merge_overlays({}, {GEN: a}, {GEN: b})[GEN]
    assert "# a\n" in m and "# b\n" in m


def test_lineage_round_trip(tmp_path):
    lin = Lineage()
    lin.add("stock")
    lin.add("c1", ["stock"], tok_s=10.0)
    lin.add("c2", ["stock"])
    lin.add("m0", ["c1", "c2"], status="accepted")
    lin.save(tmp_path / "l.json")
    back = Lineage.load(tmp_path / "l.json")
    assert back.ancestors("m0") == {"stock", "c1", "c2"}
    assert back.g.nodes["c1"]["tok_s"] == 10.0


def test_kernel_agent_on_cpu_has_nothing_to_tune():
    cands, notes = KernelAgent("float32").propose(ctx())
    assert cands == [] and "nothing to tune on cpu" in notes[0]["note"]


def test_replay_agent_reissues_recorded_proposals(tmp_path):
    tr = Trace(tmp_path / "old")
    table = {"specpilot/kernels/tuned/x.json": '{"device": "x", "entries": {}}'}
    c = Candidate("c007", "llm:openai", {"k": 3}, (Edit(NGRAM, "a", "b"),), "why", ("stock",), 0,
                  table)
    tr.append("proposal", "c007", ("stock",), proposal=c.to_dict())
    tr.append("proposal", None, (), agent="llm:openai", note="no candidate")
    agent = ReplayAgent(str(tr.path))
    got, _ = agent.propose(ctx(best_id="c001"))
    assert len(got) == 1 and got[0].knobs == {"k": 3} and got[0].edits == c.edits
    assert got[0].files == table
    assert got[0].parents == ("c001",) and got[0].agent == "replay:llm:openai"
    assert agent.propose(ctx(round=1))[0] == []


def test_front_runners_are_the_best_of_each_family_even_when_timed_below_stock():
    """A family whose only candidate timed slower than stock in the search still reaches
    the confirmation (one noisy measurement must not sink it); one per family, best first,
    the search's best leading, at most confirm_top."""
    from types import SimpleNamespace as NS

    from specpilot.agents.promotion import front_runners

    knobs = {"stock": Knobs(drafter="block:/m/b"), "ar": Knobs(),
             "c1": Knobs(drafter="block:/m/b", k=3), "c2": Knobs(drafter="ngram"),
             "c3": Knobs(drafter="block:/m/b", k=5), "c4": Knobs(drafter="draft:/m/d"),
             "c5": Knobs(drafter="ngram", k=2), "c6": Knobs(drafter="ngram", threads=1),
             "c7": Knobs(drafter="draft:/m/d", k=2)}
    tok_s = {"stock": 500, "ar": 480, "c1": 520, "c2": 414, "c3": 510, "c4": 380, "c5": 400,
             "c6": 600, "c7": 390}
    specs = {c: NS(hash=f"h{c}", knobs=k) for c, k in knobs.items()}
    results = {f"h{c}": NS(accepted=c != "c6", tok_s=t) for c, t in tok_s.items()}
    st = NS(specs=specs, results=results, best="c3")
    search = NS(st=st, cfg=NS(seed=0, confirm_top=3))
    # c6 is not verified; c3 is the search's best; ngram's best timed 0.83x stock
    assert front_runners(search) == ["c3", "c2", "c7"]
    search.cfg.confirm_top = 2
    assert front_runners(search) == ["c3", "c2"]


def test_a_round_shrinks_to_what_still_fits_the_time_limit():
    """With a stock evaluation of 60 s and 14 minutes, a full round of 4 (4 evaluations and
    a merge), the 3 gate checks and a confirmation of 3 front runners (5 engines) fit only
    while 13 evaluations' time is left; after that the round shrinks (a single proposal
    needs no merge slot) and, below 9 evaluations' time, no round runs. Two workers
    evaluate a round's candidates two at a time; two agents make twice the candidates."""
    import time
    from types import SimpleNamespace as NS

    from specpilot.agents.loop import Search

    def size(spent_s, workers=1, agents=("heuristic",)):
        s = NS(cfg=NS(workers=workers, time_limit_min=14.0, per_round=4, confirm_top=3,
                      agents=agents), t0=time.time() - spent_s)
        return Search.round_size(s, 60.0)

    assert size(0) == 4  # 840 s left, 780 needed
    assert size(70) == 3  # 770 s left: 12 evaluations fit, 13 do not
    assert size(130) == 2  # 710 s: 2 proposals and a merge, 11 evaluations
    assert size(200) == 1  # 640 s: 2 proposals and their merge no longer fit, 1 does
    assert size(300) == 0  # 540 s: not even 9
    assert size(130, workers=2) == 4  # 5 jobs in 3 waves: 11 evaluations' time
    assert size(0, agents=("heuristic", "llm")) == 2  # 4 candidates and a merge, 13 in all
    assert size(200, agents=("heuristic", "llm")) == 0  # 2 candidates and a merge: 11
