"""The W12 kernel targets scored on a w12_bench run (`benchmarks/w12_targets.py`)."""

from __future__ import annotations

import json

import pytest

from benchmarks.w12_targets import main, score


def _row(shape, batch, cublas, tbf16, w12):
    best = min(cublas, tbf16)
    return {"shape": shape, "batch": batch, "cublas_us": cublas, "tbf16_us": tbf16,
            "w12_us": w12, "vs_best_bf16": best / w12, "vs_cublas": cublas / w12}


def _res():
    return {"device": "test", "date": "2026-12-01",
            "shapes": [{"shape": "a", "read_w12_us": 15.0, "read_bf16_us": 20.0},
                       {"shape": "b", "read_w12_us": 30.0, "read_bf16_us": 40.0}],
            "rows": [_row("a", 1, 30.0, 25.0, 19.0),  # 25 / 19 = 1.316: met
                     _row("b", 1, 60.0, 50.0, 42.0),  # 1.190: not met
                     _row("a", 8, 28.0, 25.0, 20.0),  # exactly 1.25: met
                     _row("b", 16, 60.0, 62.0, 50.0),  # 1.2: not met
                     _row("a", 32, 23.0, 30.0, 20.0),  # 1.15: met at batch 32
                     _row("b", 32, 50.0, 55.0, 45.0)]}  # 1.111: not met


def test_each_row_is_scored_against_its_batchs_target():
    sc = score(_res())
    met = {(x["shape"], x["batch"]): x["met"] for x in sc["rows"]}
    assert met == {("a", 1): True, ("b", 1): False, ("a", 8): True, ("b", 16): False,
                   ("a", 32): True, ("b", 32): False}
    assert sc["counts"] == {"batch 1": {"met": 1, "of": 2}, "batch 2-16": {"met": 1, "of": 2},
                            "batch 32": {"met": 1, "of": 2}}


def test_what_a_target_asks_in_plain_read_terms():
    x = next(r for r in score(_res())["rows"] if (r["shape"], r["batch"]) == ("b", 1))
    # best bf16 50 us -> the target needs 40 us; a plain read of the W12 bytes takes 30
    assert x["need_us"] == pytest.approx(40.0)
    assert x["need_read"] == pytest.approx(0.75)
    assert x["at_read"] == pytest.approx(30.0 / 42.0)
    assert x["bf16_at_read"] == pytest.approx(40.0 / 50.0)


def test_batch1_geomean_is_over_cublas():
    sc = score(_res())
    assert sc["geomean_vs_cublas_b1"] == pytest.approx((30 / 19 * 60 / 42) ** 0.5)
    assert sc["geomean_met"] is True
    res = _res()
    res["rows"][0] = _row("a", 1, 20.0, 25.0, 19.0)  # 20 / 19 and 60 / 42: geomean 1.226
    assert score(res)["geomean_met"] is False


def test_cli_scores_a_file_and_refuses_a_damaged_one(tmp_path, capsys):
    good = tmp_path / "w12_bench.json"
    good.write_text(json.dumps(_res()))
    assert main([str(good)]) == 0
    out = capsys.readouterr().out
    assert "batch 2-16: target met on 1 of 2" in out
    assert "geomean W12 vs cuBLAS 1.502 (target 1.4): met" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": [')
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {bad} is not a readable w12_bench.json") and "\n" not in err
