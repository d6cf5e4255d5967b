"""The `specpilot` command line: one thin sub-command per user verb.

Each area registers its commands here; the work lives in the area's own module. Errors a
user can act on (SpecPilotError) print as one line and exit 2, never as a traceback; so do
the argument parser's own (unknown option, missing or malformed value: with the command's
--help to see), a file that cannot be read or written and a damaged JSON or text input that
a command did not check itself (the last line of defence, not the way errors are meant to be
reported).
"""

from __future__ import annotations

import json
import sys

import typer

from .runtime.errors import SpecPilotError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command()
def version() -> None:
    """Print the SpecPilot version."""
    from specpilot import __version__

    print(__version__)


def _add_costmodel() -> None:
    from .costmodel.cli import app as costmodel_app  # typer only; the model loads lazily

    app.add_typer(costmodel_app, name="costmodel")


_add_costmodel()


@app.command()
def generate(
    model: str = typer.Option(None, help="HF checkpoint directory of the target"),
    deployment: str = typer.Option(None, help="deployment name: model, drafter, knobs"),
    drafter: str = typer.Option(None, help="ngram | draft:DIR | block:DIR | none"),
    k: int = typer.Option(None, help="drafted tokens per verify step"),
    prompt: str = typer.Option(None, help="prompt text"),
    input_ids: str = typer.Option(None, help="prompt token ids, e.g. 1,2,3"),
    prompts_file: str = typer.Option(None, help="JSONL: prompt or input_ids (and id) a line"),
    max_new_tokens: int = typer.Option(None, help="new tokens per prompt (default 128)"),
    ignore_eos: bool = typer.Option(False, help="keep going past EOS"),
    device: str = typer.Option(None, help="cpu | cuda"),
    dtype: str = typer.Option(None, help="float32 | bfloat16 | float16"),
    threads: int = typer.Option(None, help="torch CPU threads"),
    weights: str = typer.Option(None, help="bf16 | w12 (lossless 12-bit weights; CUDA + bfloat16)"),
    batch: int = typer.Option(None, help="prompts per generate call (default: all)"),
    json_out: bool = typer.Option(False, "--json", help="one JSON object per prompt a line"),
) -> None:
    """Generate greedily (optionally speculatively) and print the text or JSON."""
    from .runtime import cli_commands as cc

    spec = cc.resolve_spec(model, deployment, drafter, k, device, dtype, threads,
                           max_new_tokens, weights=weights)
    items = cc.read_prompts(prompt, input_ids, prompts_file)
    cc.run_generate(spec, items, ignore_eos=ignore_eos, as_json=json_out, batch=batch)


@app.command()
def serve(
    model: str = typer.Option(None, help="HF checkpoint directory of the target"),
    deployment: str = typer.Option(None, help="deployment name: model, drafter, knobs"),
    drafter: str = typer.Option(None, help="ngram | draft:DIR | block:DIR | none"),
    k: int = typer.Option(None, help="drafted tokens per verify step"),
    port: int = typer.Option(30000, help="TCP port"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    device: str = typer.Option(None, help="cpu | cuda"),
    dtype: str = typer.Option(None, help="float32 | bfloat16 | float16"),
    threads: int = typer.Option(None, help="torch CPU threads"),
    weights: str = typer.Option(None, help="bf16 | w12 (lossless 12-bit weights; CUDA + bfloat16)"),
    max_batch: int = typer.Option(8, help="requests per engine batch"),
) -> None:
    """Serve SGLang's /generate and OpenAI's /v1 API over HTTP (greedy only)."""
    from .runtime import cli_commands as cc

    spec = cc.resolve_spec(model, deployment, drafter, k, device, dtype, threads, None,
                           weights=weights)
    cc.run_serve(spec, host, port, max_batch)


@app.command()
def verify(
    model: str = typer.Option(None, help="the stock target checkpoint directory"),
    outputs: str = typer.Option(None, help="JSONL of records, or a bench result JSON"),
    server: str = typer.Option(None, help="check against this SGLang-compatible /generate URL"),
    max_new_tokens: int = typer.Option(None, help="the generation limit the outputs ran under"),
    tie_margin: float = typer.Option(None, help="tie margin (default: calibrated per device)"),
    calibrate: bool = typer.Option(False, "--calibrate", help="measure and store the tie margin"),
    device: str = typer.Option("cpu", help="cpu | cuda (the local reference)"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    json_out: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
) -> None:
    """Token forcing: check every committed token against the stock model (exit 1 if not)."""
    from .forcing.report import verify_command

    raise typer.Exit(verify_command(model, outputs, server, max_new_tokens, json_out,
                                    calibrate, device, dtype, tie_margin))


@app.command()
def bench(
    out: str = typer.Option(..., help="where to write the result JSON"),
    deployment: str = typer.Option(None, help="deployment name"),
    engine: str = typer.Option(None, help="ar | stock | an engine directory"),
    model: str = typer.Option(None, help="target checkpoint (instead of --deployment)"),
    drafter: str = typer.Option(None, help="ngram | draft:DIR | block:DIR | none (with --model)"),
    k: int = typer.Option(None, help="drafted tokens per verify step"),
    workload: str = typer.Option(None, help="workload name or JSONL file"),
    limit: int = typer.Option(None, help="only the first N prompts"),
    batch: int = typer.Option(None, help="concurrent requests per batch"),
    max_new_tokens: int = typer.Option(None, help="new tokens per request"),
    server: str = typer.Option(None, help="bench this SGLang-compatible server instead"),
    repeats: int = typer.Option(1, help="measured passes after the warm-up"),
    device: str = typer.Option(None, help="cpu | cuda"),
    dtype: str = typer.Option(None, help="float32 | bfloat16 | float16"),
) -> None:
    """Benchmark an engine on a workload; the outputs recorded are what verify checks."""
    from .bench.bench import bench_command

    res = bench_command(deployment, engine, model, drafter, k, workload, limit, batch,
                        max_new_tokens, server, repeats, out, device, dtype)
    t = res["totals"]
    print(f"{t['requests']} requests, {t['new_tokens']} tokens, {t['tokens_per_s']:.1f} tok/s, "
          f"acceptance {t['accept_length']:.2f} -> {out}")


compare_app = typer.Typer(no_args_is_help=True, help="Compare bench results: speed and score.")
app.add_typer(compare_app, name="compare")


@compare_app.command("speed")
def compare_speed(
    ar: str = typer.Option(..., help="bench result of the ar engine"),
    stock: str = typer.Option(..., help="bench result of the stock engine"),
    final: str = typer.Option(None, help="bench result of the final engine"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Speedups with 95% paired bootstrap CIs, per dataset, and output consistency."""
    from .bench.compare import speed_command

    speed_command(ar, stock, final, json_out)


@compare_app.command("score")
def compare_score(
    final: str = typer.Argument(..., help="bench result of the final engine"),
    stock: str = typer.Argument(..., help="bench result of the stock engine"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Answers (\\boxed{}, tests in a sandbox) per dataset, and the difference."""
    from .bench.score import score_command

    score_command(final, stock, json_out)


@app.command()
def search(
    deployment: str = typer.Option(None, help="deployment name or TOML path"),
    budget: int = typer.Option(24, help="evaluations of proposed candidates"),
    time_limit: float = typer.Option(14.0, help="minutes before the last round starts"),
    agents: str = typer.Option("heuristic", help="heuristic,llm,replay,kernel"),
    llm: str = typer.Option(None, help="anthropic:MODEL | openai:MODEL (keys from env)"),
    llm_base_url: str = typer.Option(None, help="base URL of an OpenAI/Anthropic-compatible server"),
    replay_from: str = typer.Option(None, help="run id (or trace.jsonl) for the replay agent"),
    workers: int = typer.Option(1, help="parallel evaluations (one per CPU slot / GPU)"),
    ray_address: str = typer.Option(None, help="join this Ray cluster instead of a local one"),
    run_id: str = typer.Option(None, help="name of the new run"),
    resume: str = typer.Option(None, help="resume this run id from its trace"),
    seed: int = typer.Option(0, help="seed of the heuristic agent and the bootstrap"),
    per_round: int = typer.Option(4, help="proposals per agent per round"),
    repeats: int = typer.Option(2, help="timed repeats of the dev set per evaluation"),
    dev_limit: int = typer.Option(8, help="dev (and gate) prompts per evaluation"),
    eval_timeout: float = typer.Option(0.0, help="seconds per evaluation (0: 10x stock's)"),
    no_promote: bool = typer.Option(False, "--no-promote", help="do not write engines/"),
    quiet: bool = typer.Option(False, help="no live progress"),
) -> None:
    """Search for the fastest lossless engine of a deployment and ship it to engines/."""
    args = dict(locals())
    from .agents.search_cli import search_command

    search_command(**args)


@app.command()
def replay(
    engine_dir: str = typer.Argument(..., help="engines/DEPLOYMENT/NAME"),
    json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
    rounds: int = typer.Option(2, help="timed rounds of the dev set (interleaved engines)"),
    dev_limit: int = typer.Option(8, help="dev (and gate) prompts"),
) -> None:
    """Rebuild an engine, check its hash, verify it on dev and gate, time it interleaved
    with stock and ar."""
    from .agents.search_cli import replay_command

    raise typer.Exit(replay_command(engine_dir, json_out, rounds, dev_limit))


runs_app = typer.Typer(no_args_is_help=True, help="Search runs: list, show, report.")
app.add_typer(runs_app, name="runs")


@runs_app.command("list")
def runs_list() -> None:
    """Every run under runs/ with its deployment and best engine."""
    from .agents.search_cli import runs_list_command

    runs_list_command()


@runs_app.command("show")
def runs_show(run_id: str = typer.Argument(..., help="run id")) -> None:
    """Gaps, every candidate (change, speed, verdict, why rejected) and the lineage."""
    from .trace import show_run

    show_run(run_id)


@runs_app.command("report")
def runs_report(run_id: str = typer.Argument(..., help="run id"),
                out: str = typer.Option(None, help="HTML file (default runs/RUN/report.html)")) -> None:
    """A self-contained HTML report with plots."""
    from .trace import write_report

    print(write_report(run_id, out))


w12_app = typer.Typer(no_args_is_help=True, help="W12 lossless 12-bit weights.")
app.add_typer(w12_app, name="w12")


@w12_app.command("stats")
def w12_stats(model: str = typer.Option(..., help="HF checkpoint directory")) -> None:
    """Per tensor: exponent coverage, escape rate and bits per weight in W12 form."""
    from .kernels.stats import checkpoint_stats, print_stats

    print_stats(checkpoint_stats(model))


zoo_app = typer.Typer(no_args_is_help=True, help="The tiny model zoo: train and evaluate.")
app.add_typer(zoo_app, name="zoo")


@zoo_app.command("train", add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def zoo_train(ctx: typer.Context) -> None:
    """Train tokenizer, target, draft and block drafter (see --help for the recipe's flags)."""
    from .zoo.train import main as train_main

    train_main(list(ctx.args))


@zoo_app.command("eval")
def zoo_eval(
    models: str = typer.Option("models/tiny-pycode", help="zoo directory (target/draft/block)"),
    workload: str = typer.Option("tiny-pycode-dev", help="workload name or JSONL file"),
    ks: str = typer.Option("2,4,8", help="drafted tokens per step to try"),
    max_new_tokens: int = typer.Option(96, help="new tokens per prompt"),
    batch_size: int = typer.Option(1, help="prompts per generate call"),
    threads: int = typer.Option(2, help="torch CPU threads"),
    limit: int = typer.Option(0, help="only the first N prompts (0: all)"),
    heldout: bool = typer.Option(True, help="also report the target's held-out loss"),
) -> None:
    """Held-out perplexity of the target and acceptance of each drafter (real Engine)."""
    from .zoo.evaluate import main as eval_main

    eval_main(models, workload, ks, max_new_tokens, batch_size, threads, limit, heldout)


deployments_app = typer.Typer(no_args_is_help=True, help="Deployments defined in deployments/.")
app.add_typer(deployments_app, name="deployments")


@deployments_app.command("list")
def deployments_list() -> None:
    """Every deployment: device, target, drafter, batch sizes, workloads."""
    from .deployment_show import list_command

    list_command()


@deployments_app.command("show")
def deployments_show(name: str = typer.Argument(..., help="deployment name or TOML path")) -> None:
    """One deployment in full, stock knobs included."""
    from .deployment_show import show_command

    show_command(name)


def _command_line_error(e: Exception) -> tuple[str, int] | None:
    """(one line, exit code) of an error the argument parser raised, else None. Typer's
    parser is click, vendored by recent typer releases: recognized by its classes' names."""
    names = {c.__name__ for c in type(e).__mro__}
    if "ClickException" not in names:
        return None
    msg = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    if "UsageError" in names:
        path = ctx.command_path if ctx is not None else "specpilot"
        return f"error: {msg} (see '{path} --help')", 2
    return f"error: {msg}", e.exit_code


def main() -> None:
    try:
        rc = app(prog_name="specpilot", standalone_mode=False)
    except SpecPilotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # a file the command was given (or needs) cannot be used
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}: check the path and its permissions",
              file=sys.stderr)
        sys.exit(2)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:  # a damaged input file
        print(f"error: an input file is damaged ({type(e).__name__}: {str(e)[:120]}): "
              "check the files the command was given", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as before
            if e.format_message():  # (typer's rich help has printed itself already)
                print(e.format_message())
            sys.exit(2)
        if type(e).__name__ == "Abort":  # end of input at a prompt
            print("error: aborted", file=sys.stderr)
            sys.exit(1)
        found = _command_line_error(e)
        if found is None:
            raise
        print(found[0], file=sys.stderr)
        sys.exit(found[1])
    sys.exit(rc if isinstance(rc, int) else 0)
