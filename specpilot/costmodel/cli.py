"""`specpilot costmodel ...` and `specpilot costmodel calibrate`: thin typer wrappers."""

from __future__ import annotations

import json

import typer

from ..runtime.errors import SpecPilotError

app = typer.Typer(invoke_without_command=True, no_args_is_help=False,
                  help="Roofline bound of every decoding step, and device calibration.")


@app.callback()
def costmodel(
    ctx: typer.Context,
    deployment: str | None = typer.Option(None, help="deployment name or TOML path"),
    model: str | None = typer.Option(None, help="checkpoint dir, config.json or preset "
                                                   "(8b, 32b, 30b-a3b)"),
    gpu: str | None = typer.Option(None, help="h100, h200, a100, l40s, b200, "
                                                 "rtx-pro-6000 or cpu"),
    batch: int | None = typer.Option(None, help="sequences per step"),
    context: int = typer.Option(1024, help="tokens already in the KV cache"),
    k: int | None = typer.Option(None, help="drafted tokens per verify step"),
    drafter: str | None = typer.Option(None, help="drafter kind: draft, block or ngram"),
    drafter_config: str | None = typer.Option(None, help="drafter checkpoint or config"),
    alpha: float = typer.Option(0.7, help="per-token acceptance rate for the speedup bound"),
    weights: str | None = typer.Option(None, help="bf16, fp16, fp32, fp8 or w12"),
    ceilings: str = typer.Option("auto", help="auto, datasheet, calibrated or reference"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    plot: str | None = typer.Option(None, help="write a roofline chart here (.png, .svg, .pdf)"),
) -> None:
    """Bound, per operator, of the AR step (and with --k the verify and draft steps)."""
    if ctx.invoked_subcommand is not None:
        return
    from .hardware import get_hardware
    from .report import PLOT_SUFFIXES, analyze, plot_roofline, print_tables
    from .roofline import StepCost
    from .spec import load_spec

    for flag, value, low in (("--batch", batch, 1), ("--k", k, 1), ("--context", context, 0)):
        if value is not None and value < low:
            raise SpecPilotError(f"{flag} must be >= {low}, got {value}")
    if plot:
        from ..bench.bench import check_out_path

        check_out_path(plot, "--plot", PLOT_SUFFIXES)
    batches = None
    if deployment:
        from ..deployment import load_deployment

        dep = load_deployment(deployment)
        model = model or dep.target
        gpu = gpu or (dep.gpu if dep.device == "cuda" else "cpu") or "cpu"
        batch = batch if batch is not None else dep.batch_sizes[0]
        batches = sorted(set(dep.batch_sizes))
        if drafter is None:
            drafter = dep.drafter.kind
            drafter_config = drafter_config or dep.drafter.path or None
        if weights is None:
            w = dep.knobs.weights if dep.device == "cuda" else "fp32"
            weights = w if w == "w12" else {"float32": "fp32", "bfloat16": "bf16",
                                            "float16": "fp16"}.get(dep.dtype, None)
    if not model or not gpu:
        raise SpecPilotError("give --deployment NAME, or --model DIR_OR_CONFIG and --gpu NAME")
    spec = load_spec(model, weights=weights)
    hw = get_hardware(gpu, ceilings)
    kind = drafter or ("draft" if drafter_config else "ngram")
    dspec = load_spec(drafter_config, weights=weights) if drafter_config else None
    a = analyze(spec, hw, batch=batch if batch is not None else 1, context=context, k=k,
                drafter_kind=kind, drafter=dspec, alpha=alpha, batches=batches)
    if plot:
        steps = [StepCost.from_dict(a["ar"])]
        if "verify" in a:
            steps.append(StepCost.from_dict(a["verify"]))
        try:
            plot_roofline(steps, hw, plot, dtype=spec.fmt.compute)
        except OSError as e:
            raise SpecPilotError(f"cannot write --plot {plot} ({e.strerror or e})") from None
    if as_json:
        print(json.dumps(a, indent=1))
    else:
        print_tables(a)
        if plot:
            print(f"roofline chart: {plot}")


@app.command()
def calibrate(
    device: str = typer.Option("auto", help="auto, cpu or cuda"),
    quick: bool = typer.Option(False, help="small sizes (seconds; for tests and CPUs)"),
    as_json: bool = typer.Option(False, "--json", help="print the ceilings as JSON"),
) -> None:
    """Measure this device's ceilings and store them for later cost-model runs."""
    from .calibrate import calibrate as run
    from .hardware import calibration_path

    kw: dict = {}
    if quick:
        kw = {"shapes": ((128, 128), (256, 256)), "batches": (1, 8), "copy_bytes": 8 << 20,
                  "gemm_n": 128}
    if device not in ("auto", "cpu", "cuda"):
        raise SpecPilotError(f"--device must be auto, cpu or cuda, not {device!r}")
    c = run(device, log=None if as_json else print, **kw)
    if as_json:
        print(json.dumps(c.to_dict(), indent=1))
    else:
        print(f"saved {calibration_path(c.device)}")
