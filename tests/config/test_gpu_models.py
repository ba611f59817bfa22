"""GPU model names normalised from NVML's spelling."""

from __future__ import annotations

import pytest

from corral.config.gpu_models import normalise_gpu_model


@pytest.mark.parametrize(
    ("name", "normal"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("h100-80gb", "H100-80GB"),
        ("H100*", "H100*"),
        ("", ""),
    ],
)
def test_normalises(name: str, normal: str) -> None:
    assert normalise_gpu_model(name) == normal


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"])
def test_is_idempotent(name: str) -> None:
    once = normalise_gpu_model(name)
    assert normalise_gpu_model(once) == once
