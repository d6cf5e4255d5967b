"""Shared fixtures: small random HF checkpoints made on the spot (nothing is downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest

from tests.checkpoints import make_checkpoint


def pytest_configure(config):
    import torch

    # Tiny models on a loaded 2-core box: one thread is steadier and often faster.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def deny_read(monkeypatch):
    """deny_read(pred): Path.read_text raises PermissionError for the paths pred accepts
    (tests run as root, where chmod 000 does not stop a read)."""
    real = Path.read_text

    def deny(pred):
        def read_text(self, *a, **kw):
            if pred(self):
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *a, **kw)

        monkeypatch.setattr(Path, "read_text", read_text)

    return deny


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=0)


@pytest.fixture(scope="session")
def qwen3_draft_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3_draft"), "qwen3", seed=1,
                           hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama", seed=2)


@pytest.fixture(scope="session")
def ray_address():
    """One local Ray for the whole test session (2 CPUs, no dashboard); its GCS address.
    Started on first use, shut down at the end; a Ray already running is reused as is."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()
