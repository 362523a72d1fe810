"""The third-party packages the corpus notebooks import, for `refactor_corpus.py --extra-path`.

    python benchmarks/refactor_corpus_env.py DIR

installs them with `pip install --target DIR --no-deps` (the shared virtualenv is not touched and
pip cannot replace its CPU torch), then checks that each imports against that torch. The
torchvision wheel the package index has is built against CUDA torch: its C++ ops library
(`_C.so`) needs `libtorch_cuda.so` and does not load on CPU torch. torchvision's Python code
(datasets, transforms, models) works without it, but version 0.28 registers fake kernels for
`torchvision::nms` and `qnms` unconditionally and so fails on import when `_C.so` did not
load. This script then adds to DIR's `torchvision/extension.py` a definition of those two
operators with a CPU kernel in Python (greedy non-maximum suppression), so that the import
works and `torch.ops.torchvision.nms` gives the right answer (`torchvision.ops.nms` itself
asks for the C++ library first and raises); the other C++ ops (roi_align,
deform_conv2d...) raise torchvision's own "Couldn't load custom C++ ops" error. No corpus
notebook calls them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# torchvision 0.28 is the release for torch 2.13; the rest are the pure-Python packages (and
# their missing dependencies) that the corpus notebooks import.
PACKAGES = [
    "torchvision==0.28.0",
    "seaborn",
    "gymnasium",
    "farama-notifications",
    "gym==0.26.2",
    "gym-notices",
    "einops",
    "nltk",
    "click",
    "regex",
    "omegaconf",
    "antlr4-python3-runtime==4.9.3",
    "timm",
    "huggingface_hub",
    "safetensors",
    "pytorch-ignite",
    "pytorch_tabular",
    "pytorch-lightning<2.7",
    "torchmetrics<1.9",
    "lightning-utilities",
    "rich",
    "markdown-it-py",
    "mdurl",
    "scikit-base",
    "httpx2",
    "httpcore2",
    "truststore",
    "hf-xet",
    # the third wave (refactor_corpus3.toml)
    "gpytorch",
    "linear_operator",
    "jaxtyping",
    "wadler_lindig",
    "opacus",
    "opt_einsum",
    "xgboost-cpu",
    "seqeval",
    "torchbnn",
    "pyDOE==0.3.8",
    "scipy",
    "transformers",
    "tokenizers",
    # what the shared virtualenv no longer brings (the notebooks import them; found when the
    # folder was made again on a new machine, 2026-12-02)
    "pandas",
    "pytz",
    "narwhals",
    "matplotlib",
    "contourpy",
    "cycler",
    "fonttools",
    "kiwisolver",
    "pyparsing",
    "scikit-learn",
    "joblib",
    "threadpoolctl",
    "torchsummary",
    # the fourth wave (refactor_corpus4.toml)
    "torch_geometric",
    "xxhash",
    "torchprofile",
    "pytorch-model-summary",
    "linformer",
    "vit-pytorch",
    "mnist1d",
    "ogb",
    "outdated",
    "littleutils",
    "tabm",
    "rtdl_num_embeddings",
]
IMPORTS = [
    "torchvision",
    "seaborn",
    "gymnasium",
    "gym",
    "einops",
    "nltk",
    "omegaconf",
    "timm",
    "ignite",
    "pytorch_tabular",
    "gpytorch",
    "opacus",
    "xgboost",
    "seqeval",
    "torchbnn",
    "pyDOE",
    "transformers",
    "pandas",
    "matplotlib",
    "sklearn",
    "torch_geometric",
    "torchprofile",
    "pytorch_model_summary",
    "linformer",
    "vit_pytorch",
    "mnist1d",
    "ogb",
    "tabm",
    "rtdl_num_embeddings",
]
MARK = "# --- refactor_corpus_env: nms on CPU torch ---"
SHIM = f"""

{MARK}
if not _has_ops():

    def _nms_cpu(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        order = scores.argsort(descending=True)
        x1, y1, x2, y2 = dets.unbind(1)
        areas = (x2 - x1) * (y2 - y1)
        keep = []
        suppressed = torch.zeros(len(dets), dtype=torch.bool)
        for i in order.tolist():
            if suppressed[i]:
                continue
            keep.append(i)
            w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
            h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
            inter = w * h
            suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
        return torch.tensor(keep, dtype=torch.int64)

    _shim = torch.library.Library("torchvision", "DEF")
    for _name in ("nms", "qnms"):
        _shim.define(f"{{_name}}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _shim.impl(_name, _nms_cpu, "CPU")
"""
CHECK = """
import torch, torchvision
nms = torch.ops.torchvision.nms  # torchvision.ops.nms asks for the C++ ops first
boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60.0]])
assert nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 2]
assert torchvision.models.resnet18()(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
assert torchvision.transforms.ToTensor() is not None
for name in sys.argv[1:]:
    __import__(name)
print("torch", torch.__version__, "from", torch.__file__, "| torchvision", torchvision.__version__)
"""


def main() -> int:
    target = Path(sys.argv[1]).resolve()
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--target",
        str(target),
        "--no-deps",
        "--upgrade",
    ]
    subprocess.run([*pip, *PACKAGES], check=True)
    extension = target / "torchvision" / "extension.py"
    text = extension.read_text(encoding="utf-8")
    if MARK not in text:
        extension.write_text(text + SHIM, encoding="utf-8")
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", "import sys\n" + CHECK, *IMPORTS], env=env, cwd=target
    )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
