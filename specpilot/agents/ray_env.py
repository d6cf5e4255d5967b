"""Ray plumbing: start or join a cluster, and host each proposer in an actor of its own."""

from __future__ import annotations

import os

from ..runtime.errors import SpecPilotError


def start_ray(address: str | None = None) -> bool:
    """Join `address`, or start a local Ray; True when this call started it (stop it after)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(2, os.cpu_count() or 1), include_dashboard=False,
                     log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise SpecPilotError(f"cannot start/join Ray ({address or 'local'}): {e}") from None
    return True


def make_agent(kind: str, cfg, dep):
    """A proposer by name: heuristic | llm | replay | kernel."""
    if kind == "heuristic":
        from .heuristic import HeuristicAgent

        return HeuristicAgent(cfg.seed)
    if kind == "llm":
        from .llm import LLMAgent
        from .providers import make_provider

        if not cfg.llm:
            raise SpecPilotError("--agents llm needs --llm anthropic:MODEL or openai:MODEL")
        provider = make_provider(cfg.llm, cfg.llm_base_url)
        return LLMAgent(provider, cfg.llm.partition(":")[2])
    if kind == "replay":
        from .replay import ReplayAgent

        if not cfg.replay_from:
            raise SpecPilotError("--agents replay needs --replay-from RUN_ID")
        return ReplayAgent(cfg.replay_from)
    if kind == "kernel":
        from .kernel import KernelAgent

        return KernelAgent(dep.dtype, target=dep.target, gpu=dep.gpu or "")
    raise SpecPilotError(f"unknown agent {kind!r}: use heuristic, llm, replay or kernel")


def agent_actor(kind: str, cfg, dep):
    """A Ray actor (no CPU reserved: proposing is I/O or cheap) holding one proposer."""
    import ray

    opts: dict = {"num_cpus": 0}
    if kind == "kernel" and dep.device == "cuda":
        # the kernel subagent times kernels between rounds, while no evaluation runs: it
        # sees the GPUs without holding one (a held one would starve the evaluators)
        opts["runtime_env"] = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}

    @ray.remote(**opts)
    class AgentHost:
        def __init__(self, kind, cfg, dep):
            self.agent = make_agent(kind, cfg, dep)

        def propose(self, ctx):
            try:
                return self.agent.propose(ctx)
            except Exception as e:  # noqa: BLE001 - a broken proposer proposes nothing
                return [], [{"agent": kind, "error": f"{type(e).__name__}: {str(e)[:300]}"}]

    return AgentHost.remote(kind, cfg, dep)
