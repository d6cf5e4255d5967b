"""`specpilot costmodel` on the command line: tables, --json, --plot, deployments, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from specpilot.cli import app
from specpilot.costmodel.hardware import get_hardware
from specpilot.costmodel.roofline import ar_step
from specpilot.costmodel.spec import load_spec

MOE = {"model_type": "qwen3_moe", "vocab_size": 2000, "hidden_size": 128, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256,
           "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 64,
           "torch_dtype": "bfloat16"}


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "data"))
    p = tmp_path / "moe" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(MOE))
    return p


def _run(*args: str):
    r = CliRunner().invoke(app, ["costmodel", *args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.output


def test_json_has_ar_and_verify(cfg):
    a = json.loads(_run("--model", str(cfg), "--gpu", "h100", "--batch", "4", "--context",
                        "256", "--k", "3", "--json"))
    for step in ("ar", "verify"):
        for key in ("bytes", "flops", "bound_ms", "ops"):
            assert key in a[step]
        assert {"name", "bytes", "flops", "bound_ms"} <= set(a[step]["ops"][0])
    hw = get_hardware("h100", "datasheet")
    want = ar_step(load_spec(cfg), hw, 4, 256)
    assert a["ar"]["bytes"] == pytest.approx(want.bytes)
    assert a["ar"]["bound_ms"] == pytest.approx(want.bound_ms)
    assert a["verify"]["flops"] / a["ar"]["flops"] == pytest.approx(4, rel=0.05)
    # 4 x 4 tokens touch more experts than 4 tokens: the MoE verify reads more weights
    assert a["verify"]["bytes"] > 1.3 * a["ar"]["bytes"]
    assert [r["k"] for r in a["speedup"]][:3] == [1, 2, 3]
    assert set(a["best_k"]) == {"1", "4", "8", "32"}


def test_tables_and_plot(cfg, tmp_path):
    png = tmp_path / "roof.png"
    out = _run("--model", str(cfg), "--gpu", "h200", "--k", "2", "--plot", str(png))
    assert "AR step" in out and "verify step (k=2)" in out and "experts_gate_up" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_deployment_with_draft_model(cfg, tmp_path, qwen3_dir, qwen3_draft_dir):
    dep = tmp_path / "d.toml"
    dep.write_text(f'name = "t"\ndevice = "cuda"\ngpu = "h200"\ndtype = "bfloat16"\n'
                   f'batch_sizes = [1, 8]\ntarget = {{ path = "{qwen3_dir}" }}\n'
                   f'drafter = {{ kind = "draft", path = "{qwen3_draft_dir}" }}\n')
    a = json.loads(_run("--deployment", str(dep), "--k", "4", "--json"))
    assert a["batch"] == 1 and a["drafter"] == "draft"
    assert a["model"]["weights"] == "bf16"
    assert a["draft"]["passes"] == 4 and a["draft"]["bytes"] > 0
    assert set(a["best_k"]) == {"1", "8"}


def test_calibrate_command(cfg):
    out = _run("calibrate", "--device", "cpu", "--quick", "--json")
    c = json.loads(out)
    assert c["device"] == "cpu" and c["copy_bw"] > 0
    a = json.loads(_run("--model", str(cfg), "--gpu", "cpu", "--json"))
    assert a["hardware"]["calibrated"] == c["measured_at"]


@pytest.mark.parametrize("args, msg", [
    (["--model", "8b", "--gpu", "tpu"], "unknown gpu"),
    (["--model", "/nonexistent/dir", "--gpu", "h200"], "no model config"),
    ([], "give --deployment"),
    (["--deployment", "tiny-cpu", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["--deployment", "tiny-cpu", "--k", "0"], "--k must be >= 1, got 0"),
    (["--model", "8b", "--gpu", "h200", "--plot", "x.jsonl"], "must end in .png, .svg or .pdf"),
    (["--model", "8b", "--gpu", "h200", "--plot", "{tmp}"], "is a folder"),
    (["--model", "8b", "--gpu", "h200", "--plot", "{tmp}/f/x.png"], "is not a folder"),
    (["--model", "{tmp}/f", "--gpu", "h200"], "/f is a file but not a model config.json"),
    (["--model", "8b", "--gpu", "h200", "--drafter-config", "{tmp}/f"],
     "/f is a file but not a model config.json"),
])
def test_errors_are_one_line(args, msg, tmp_path):
    (tmp_path / "f").write_text("a file, not a folder")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = subprocess.run([sys.executable, "-c", "from specpilot.cli import main; main()",
                        "costmodel", *args], check=False, capture_output=True, text=True,
                       env={"SPECPILOT_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_calibrate_without_cuda_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = subprocess.run([sys.executable, "-m", "specpilot", "costmodel", "calibrate", "--device",
                        "cuda"], check=False, capture_output=True, text=True, timeout=120,
                       env={"SPECPILOT_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip() == ("error: --device cuda was asked for but no CUDA device is "
                                "available: use --device cpu, or a machine with a GPU")


def test_calibrate_checks_the_data_folder_before_measuring(tmp_path, monkeypatch):
    from specpilot.costmodel.calibrate import calibrate
    from specpilot.runtime.errors import SpecPilotError

    (tmp_path / "data").write_text("a file, not a folder")
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "data"))
    said: list[str] = []
    with pytest.raises(SpecPilotError, match="data folder .* is not a folder"):
        calibrate("cpu", shapes=((64, 64),), batches=(1,), copy_bytes=1 << 16, gemm_n=64,
                  log=said.append)
    assert said == []  # nothing measured
    monkeypatch.setenv("SPECPILOT_DATA", str(tmp_path / "ok"))
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "calibration").write_text("a file where the folder goes")
    with pytest.raises(SpecPilotError, match="/ok/calibration is a file, not a folder: move it"):
        calibrate("cpu", shapes=((64, 64),), batches=(1,), copy_bytes=1 << 16, gemm_n=64,
                  log=said.append)
    assert said == []


def test_plot_is_written_atomically(cfg, tmp_path, monkeypatch):
    """A temporary file beside the chart, then a rename: a failed write leaves nothing."""
    import matplotlib.figure

    png = tmp_path / "charts" / "roof.svg"
    _run("--model", str(cfg), "--gpu", "h200", "--plot", str(png))
    assert png.read_text().lstrip().startswith("<?xml")
    assert [p.name for p in png.parent.iterdir()] == ["roof.svg"]

    def fail(self, f, **kw):
        f.write(b"half a chart")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", fail)
    r = CliRunner().invoke(app, ["costmodel", "--model", str(cfg), "--gpu", "h200",
                                 "--plot", str(tmp_path / "new.png")])
    assert r.exit_code != 0 and "No space left on device" in str(r.exception)
    assert not (tmp_path / "new.png").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".new.png")] == []
