"""Interleaved timing of built engines: every engine answers every chunk, outputs are the
target's greedy ones, and a candidate that raises or hangs is dropped while the others go on."""

from __future__ import annotations

import pytest

from specpilot.agents.interleave import Entrant, interleaved
from specpilot.engines import PACKAGE, EngineSpec, build
from specpilot.runtime.factory import build_engine
from specpilot.runtime.knobs import Knobs
from tests.fixtures.search_env import indent_of, statement

NGRAM = "specpilot/runtime/drafters/ngram.py"
PROMPTS = [[5, 9, 12, 30, 7], [40, 41, 3], [8, 8, 8, 8, 21, 22]]


def entrant(name: str, knobs: Knobs, overlay: dict, root) -> Entrant:
    spec = EngineSpec("t", name, knobs, overlay)
    return Entrant(name, spec.hash, str(build(spec, root).path), knobs.to_dict())


def broken(body: str) -> dict:
    prop = statement(NGRAM, r"def propose\(")
    ind = indent_of(prop) + "    "
    text = (PACKAGE.parent / NGRAM).read_text()
    return {NGRAM: text.replace(prop, prop + "".join(f"{ind}{x}\n" for x in body.split("\n")))}


@pytest.fixture(scope="module")
def timed(qwen3_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("builds")
    ng = Knobs(drafter="ngram", k=2)
    es = [entrant("stock", ng, {}, root), entrant("k1", ng.with_(k=1), {}, root),
          entrant("ar", ng.with_(drafter=None), {}, root),
          entrant("raises", ng, broken("raise RuntimeError('candidate bug')"), root),
          entrant("hangs", ng, broken("while True:\n    pass"), root)]
    return interleaved(es, str(qwen3_dir), "cpu", "float32", PROMPTS, [1, 2], 6, rounds=2,
                       limit_s=30)


def test_every_engine_answers_every_unit_with_greedy_outputs(timed, qwen3_dir):
    engine, _ = build_engine(qwen3_dir)
    greedy = {tuple(p): g.output_ids for p, g in zip(PROMPTS, engine.generate(PROMPTS, 6))}
    for name in ("stock", "k1", "ar"):
        t = timed[name]
        r = t.result
        assert r.ok and not r.reason and t.stable, (name, r.reason)
        assert r.batch == [1, 1, 1, 2, 2, 2]
        assert all(x > 0 for x in r.time_s) and all(1 <= n <= 6 for n in r.tokens)
        assert {(tuple(x["prompt_ids"]), tuple(x["output_ids"])) for x in t.records} == \
            {(p, tuple(o)) for p, o in greedy.items()}
    assert sum(timed["ar"].result.steps) == sum(timed["ar"].result.tokens) - 6  # no drafts
    assert timed["stock"].result.accept_length >= 1.0


def test_a_broken_engine_is_dropped_with_its_reason(timed):
    r = timed["raises"].result
    assert not r.ok and "raised" in r.reason and "candidate bug" in r.reason
    h = timed["hangs"].result
    assert not h.ok and "timed out" in h.reason
    assert not r.time_s and not timed["raises"].records
