"""Write the notebooks the refactor tests use (run it to regenerate them: `python make_notebooks.py`).

- `kitchen_sink.ipynb`: every case `trainmate refactor` must handle, one or two cells each.
- `realistic_training.ipynb`: a training notebook of 100+ cells as people write them (many small
  cells, headings, constants, a Dataset, transforms, two models, a loop in a function, a %%train
  cell, evaluation, redefinitions, display-only cells), runnable on a CPU in seconds.
- `nbdev_style.ipynb`: nbdev's `#| default_exp` / `#| export` markers.
- `old_v3.ipynb`: an nbformat 3 notebook (worksheets), written as JSON by hand.
- `dataflow_versions.ipynb`: a function redefined between two calls (and a helper that calls
  it), a constant set again, a display-only section: each call must run the version live there.
- `dataflow_globals.ipynb`: `global` in functions (a counter, a list rebuilt), state a function
  passed as a value reads (`map(pad, ...)`), state a class reads outside `__init__` (itself, or
  through a function one of its methods calls).
- `dataflow_names.ipynb`: a star import of the notebook's own helper module (`%%writefile`), an
  import and a function of the same name, a class used by functions of other modules, and a
  name the notebook never defines (pre-existing: listed, the package still imports), a default
  value that is notebook state (`def described(v=vocab)`), a module imported inside `try:`.
All three run on a CPU in a second, without torch: `--execute --check-equivalence` tests them.
- `ddp_mlp.ipynb`: a tiny MLP on synthetic data with a fixed seed and an unshuffled loader, its
  loop in a plain cell: the refactored package under `torchrun --nproc-per-node 2` with batch B
  must end with the weights one process reaches with batch 2B (`test_refactor_distributed.py`).
- `corpus_imports.ipynb`: `from IPython.core.display import display` (IPython 9 no longer has
  it there; the real-notebook corpus's sksq96 VAE): the package imports it from `IPython.display`.
- `corpus_property.ipynb`: a `@property` whose own code fails mypy (pytorch_tabular's tutorial
  04): its `@no_type_check` must go under `@property`, or the class fails to build on import.
- `corpus_cuda_method.ipynb`: a model class whose method (not `__init__`) calls `.cuda()` (the
  second wave's L1aoXingyu VAE): the `device` the refactor writes in is module state of `train`,
  so the class goes there too, or its module reads a name it never binds (F821); a class whose
  `"cuda" if ... else "cpu"` the refactor leaves alone reads no `device` and stays in `model`.
- `corpus_pip_pins.ipynb`: `!pip3 install torch==1.2.0+cu92 ... -f URL` (the second wave's
  omarsar notebook), `--trusted-host HOST` and `!pip3 install subword-nmt &> log` (its
  yandexdataschool seq2seq): the package's dependencies keep the names, not a local-version pin
  no public index has, an option's value or the shell's redirection taken for a requirement.
- `equiv_unseeded.ipynb`: a model trained without a seed and a vocabulary from a `set` of
  characters (the second wave's GunhoChoi char RNN): `--check-equivalence` must compare the
  notebook with the package from the same random and hash state, not report their numbers apart.
- `equiv_local_data.ipynb` (with `equiv_local_data.csv`): reads its data beside itself and saves
  `model.pt` there (the second wave's deeplearningzerotoall time series): `--execute` and the
  package's run find the file, and neither changes the user's folder.
- `sweep_mlp.ipynb`: a `%%train --sweep 3` cell choosing its learning rate with `suggest()`: the
  refactored package's `sweep` and `train` commands (`test_refactor_sweep.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell

HERE = Path(__file__).parent


def code(source: str, tags: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    cell = new_code_cell(source.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def md(source: str) -> nbformat.NotebookNode:
    return new_markdown_cell(source.strip("\n"))


def save(name: str, cells: list[nbformat.NotebookNode]) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:03d}"  # stable ids: the files do not change when regenerated
    nbformat.write(nb, HERE / name)


def kitchen_sink() -> None:
    save(
        "kitchen_sink.ipynb",
        [
            md("# Kitchen sink\nEvery notebook habit the refactor must survive."),
            code("!pip install -q 'tqdm>=4.60' rich==13.7.1\n%pip install packaging"),
            code("%matplotlib inline\n%load_ext autoreload\n%autoreload 2\n%watermark -v"),
            code(
                "import os\nimport torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset"
            ),
            new_raw_cell("raw cell: ignored"),
            code(""),
            md("## Config\nHyperparameters."),
            code("LR = 0.05\nEPOCHS = 2\nHIDDEN = 8\nNAME = 'sink'\nLAYERS = [8, 8]"),
            md("## Data"),
            code(
                "def make_loader(n):\n"
                "  g = torch.Generator().manual_seed(0)\n"
                "  x = torch.randn(n, 4, generator=g)\n"
                "  y = (x.sum(1) > 0).long()\n"
                "  return DataLoader(TensorDataset(x, y), batch_size=16)\n"
            ),
            code("%%time\nloader = make_loader(64)\ncount = len(loader)"),
            code("%time n_batches = len(loader)"),
            md("## Model"),
            code(
                "class Net(nn.Module):\n"
                "\tdef __init__(self):\n"
                "\t\tsuper().__init__()\n"
                "\t\tself.body = nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))\n"
                "\tdef forward(self, x):\n"
                "\t\treturn self.body(x)\n"
            ),
            code(
                "device = torch.device('cuda:2')\nmodel = Net().cuda()\nopt = torch.optim.SGD(model.parameters(), lr=LR)"
            ),
            md("## Training"),
            code(
                "def step(xb, yb):\n"
                "    opt.zero_grad()\n"
                "    loss = nn.functional.cross_entropy(model(xb.to(device)), yb.to(device))\n"
                "    loss.backward()\n"
                "    opt.step()\n"
                "    return loss.item()\n"
            ),
            code(
                "def fit(epochs):\n    return [step(xb, yb) for _ in range(epochs) for xb, yb in loader]"
            ),
            code(
                "def fit(epochs):\n"
                "    losses = []\n"
                "    for _ in range(epochs):\n"
                "        for xb, yb in loader:\n"
                "            losses.append(step(xb, yb))\n"
                "    return losses\n"
            ),
            code("losses = fit(EPOCHS)\nlosses[-1]"),
            code(
                "%%train --amp off\n"
                "for epoch in range(EPOCHS):\n"
                "    for xb, yb in loader:\n"
                "        opt.zero_grad()\n"
                "        nn.functional.cross_entropy(model(xb.to(device)), yb.to(device)).backward()\n"
                "        opt.step()\n"
                "trained = True"
            ),
            code(
                "def accuracy(model, loader):\n"
                "    right = sum((model(xb.to(device)).argmax(1) == yb.to(device)).sum().item() for xb, yb in loader)\n"
                "    return right / sum(len(yb) for _, yb in loader)\n",
                tags=("trainmate:module=metrics",),
            ),
            code("acc = accuracy(model, loader)\nprint('%s accuracy %.2f'\n      % (NAME, acc))"),
            code("files = !ls\nfor f in files[:1]:\n    !echo {f}\n"),
            code("%%writefile settings.txt\nname = sink\n"),
            code("%cd /tmp"),
            code("%%bash\necho from bash"),
            code("lr = <YOUR CODE HERE>"),
            code("if __name__ == '__main__':\n    print('trained', trained, acc)"),
            md("That is all."),
        ],
    )


REALISTIC = r"""
# md: # CIFAR-like classification (synthetic data)
# md: A training notebook the way people write them: small cells, state everywhere.
!pip install -q tqdm
%load_ext autoreload
%autoreload 2
%load_ext jupyter_trainmate
import math
import random
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, DataLoader
from tqdm.auto import tqdm
# md: ## Configuration
SEED = 0
N_TRAIN = 512
N_VALID = 128
IMAGE_SIZE = 8
CHANNELS = 3
N_CLASSES = 4
BATCH_SIZE = 64
EPOCHS = 2
LR = 3e-3
WEIGHT_DECAY = 1e-4
DROPOUT = 0.1
WIDTH = 16
def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
seed_everything(SEED)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
device
# md: ## Data
# md: Synthetic images whose class is the brightest quadrant.
def make_images(n, generator):
    images = torch.rand(n, CHANNELS, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    half = IMAGE_SIZE // 2
    quadrants = torch.stack([
        images[:, :, :half, :half].mean((1, 2, 3)),
        images[:, :, :half, half:].mean((1, 2, 3)),
        images[:, :, half:, :half].mean((1, 2, 3)),
        images[:, :, half:, half:].mean((1, 2, 3)),
    ], 1)
    return images, quadrants.argmax(1)
g = torch.Generator().manual_seed(SEED)
train_x, train_y = make_images(N_TRAIN, g)
valid_x, valid_y = make_images(N_VALID, g)
train_x.shape
train_y[:10]
MEAN = 0.5
STD = 0.29
def normalize(x):
    return (x - MEAN) / STD
def random_flip(x):
    if random.random() < 0.5:
        return x.flip(-1)
    return x
class ImageDataset(Dataset):
    def __init__(self, images, labels, transform=None):
        self.images = images
        self.labels = labels
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i]
        if self.transform is not None:
            x = self.transform(x)
        return normalize(x), self.labels[i]
train_ds = ImageDataset(train_x, train_y, transform=random_flip)
valid_ds = ImageDataset(valid_x, valid_y)
len(train_ds), len(valid_ds)
def collate(batch):
    xs, ys = zip(*batch)
    return torch.stack(xs), torch.stack(ys)
train_loader = DataLoader(train_ds, batch_size=BATCH_SIZE, shuffle=True, collate_fn=collate)
valid_loader = DataLoader(valid_ds, batch_size=BATCH_SIZE, collate_fn=collate)
xb, yb = next(iter(train_loader))
xb.shape, yb.shape
# md: ## Model
class ConvBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))
class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(ConvBlock(CHANNELS, WIDTH), ConvBlock(WIDTH, WIDTH))
        self.drop = nn.Dropout(DROPOUT)
        self.head = nn.Linear(WIDTH, N_CLASSES)

    def forward(self, x):
        x = self.blocks(x)
        x = x.mean((2, 3))
        return self.head(self.drop(x))
class LinearBaseline(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(CHANNELS * IMAGE_SIZE * IMAGE_SIZE, N_CLASSES)

    def forward(self, x):
        return self.fc(x.flatten(1))
def count_parameters(m):
    return sum(p.numel() for p in m.parameters() if p.requires_grad)
baseline = LinearBaseline().to(device)
count_parameters(baseline)
model = SmallNet().to(device)
count_parameters(model)
model(xb.to(device)).shape
# md: ## Training
loss_fn = nn.CrossEntropyLoss()
def make_optimizer(m):
    return torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
optimizer = make_optimizer(model)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS * len(train_loader))
def train_one_epoch(m, loader, opt, sched):
    m.train()
    total, seen = 0.0, 0
    for xb, yb in tqdm(loader, leave=False):
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = loss_fn(m(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
        total += loss.item() * len(yb)
        seen += len(yb)
    return total / seen
@torch.no_grad()
def evaluate(m, loader):
    m.eval()
    correct, seen, total = 0, 0, 0.0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        out = m(xb)
        total += loss_fn(out, yb).item() * len(yb)
        correct += (out.argmax(1) == yb).sum().item()
        seen += len(yb)
    return total / seen, correct / seen
evaluate(model, valid_loader)
history = []
for epoch in range(EPOCHS):
    train_loss = train_one_epoch(model, train_loader, optimizer, scheduler)
    valid_loss, valid_acc = evaluate(model, valid_loader)
    history.append((train_loss, valid_loss, valid_acc))
    print(f"epoch {epoch}: train {train_loss:.3f} valid {valid_loss:.3f} acc {valid_acc:.2f}")
history[-1]
# md: ## The baseline, for comparison
baseline_opt = make_optimizer(baseline)
baseline_sched = torch.optim.lr_scheduler.StepLR(baseline_opt, step_size=1)
for epoch in range(EPOCHS):
    train_one_epoch(baseline, train_loader, baseline_opt, baseline_sched)
baseline_loss, baseline_acc = evaluate(baseline, valid_loader)
baseline_acc
# md: ## A second schedule, with %%train
%%train --amp off
model2 = SmallNet().to(device)
optimizer2 = make_optimizer(model2)
for epoch in range(EPOCHS):
    model2.train()
    for xb, yb in train_loader:
        xb, yb = xb.to(device), yb.to(device)
        optimizer2.zero_grad()
        loss = loss_fn(model2(xb), yb)
        loss.backward()
        optimizer2.step()
model2_loss, model2_acc = evaluate(model2, valid_loader)
model2_acc
# md: ## Results
def summarize(history):
    best = max(h[2] for h in history)
    return {"best_acc": best, "final_train_loss": history[-1][0]}
summary = summarize(history)
summary
results = {"model": summary["best_acc"], "baseline": baseline_acc, "model2": model2_acc}
for name, acc in sorted(results.items()):
    print(f"{name:10s} {acc:.3f}")
# md: ## Errors per class
def per_class_accuracy(m, loader):
    m.eval()
    right = torch.zeros(N_CLASSES)
    total = torch.zeros(N_CLASSES)
    with torch.no_grad():
        for xb, yb in loader:
            pred = m(xb.to(device)).argmax(1).cpu()
            for c in range(N_CLASSES):
                mask = yb == c
                right[c] += (pred[mask] == c).sum()
                total[c] += mask.sum()
    return (right / total.clamp(min=1)).tolist()
per_class = per_class_accuracy(model, valid_loader)
per_class
worst = int(np.argmin(per_class))
print("worst class", worst)
# md: ## Saving
CHECKPOINT = "model.pt"
def save(m, path):
    torch.save(m.state_dict(), path)
save(model, CHECKPOINT)
reloaded = SmallNet().to(device)
reloaded.load_state_dict(torch.load(CHECKPOINT, weights_only=True))
evaluate(reloaded, valid_loader)
# md: ## Scratch
def normalize(x):
    return (x - MEAN) / STD
math.sqrt(2)
"""


def realistic() -> None:
    """One cell per top-level statement (a block with its body; a %%cell up to the next heading)."""
    cells: list[nbformat.NotebookNode] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            cells.append(code("\n".join(current)))
            current.clear()

    for line in REALISTIC.strip("\n").split("\n"):
        if line.startswith("# md: "):
            flush()
            cells.append(md(line.removeprefix("# md: ")))
        elif (
            not line
            or line.startswith((" ", "\t", ")", "]", "}"))
            or (current and current[0].startswith("%%"))
            or (current and current[-1].startswith("@"))
        ):
            current.append(line)
        else:
            flush()
            current.append(line)
    flush()
    save("realistic_training.ipynb", cells)


def nbdev_style() -> None:
    save(
        "nbdev_style.ipynb",
        [
            code("#| default_exp layers"),
            md("# Layers\nnbdev style: only exported cells are the package."),
            code("#| export\nimport torch\nfrom torch import nn"),
            code(
                "#| export\nclass Scale(nn.Module):\n    def __init__(self, factor=2.0):\n        super().__init__()\n        self.factor = factor\n\n    def forward(self, x):\n        return x * self.factor"
            ),
            code("Scale()(torch.ones(2))  # a quick check, not exported"),
            code("#| export\ndef double(x):\n    return Scale(2.0)(x)"),
            code("def scratch():\n    return 'not exported'"),
        ],
    )


def old_v3() -> None:
    notebook = {
        "metadata": {"name": "old"},
        "nbformat": 3,
        "nbformat_minor": 0,
        "worksheets": [
            {
                "cells": [
                    {
                        "cell_type": "heading",
                        "level": 1,
                        "metadata": {},
                        "source": ["An old notebook"],
                    },
                    {
                        "cell_type": "code",
                        "collapsed": False,
                        "input": ["import torch\n", "SCALE = 3"],
                        "language": "python",
                        "metadata": {},
                        "outputs": [],
                    },
                    {
                        "cell_type": "code",
                        "collapsed": False,
                        "input": ["def scaled(x):\n", "    return x * SCALE"],
                        "language": "python",
                        "metadata": {},
                        "outputs": [],
                    },
                    {
                        "cell_type": "code",
                        "collapsed": False,
                        "input": ["print(scaled(torch.ones(2)))"],
                        "language": "python",
                        "metadata": {},
                        "outputs": [],
                    },
                ],
                "metadata": {},
            }
        ],
    }
    (HERE / "old_v3.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")


def dataflow_versions() -> None:
    save(
        "dataflow_versions.ipynb",
        [
            md("# Versions\nA teaching notebook evolves a function."),
            code("import math"),
            md("## Data"),
            code("xs = [1.0, 2.0, 3.0, 4.0]\n# tried: SCALE = 2.5\nSCALE = 1.0"),
            md("## A first loss"),
            code(
                "def split_loss(split):\n"
                "    return SCALE * sum(xs) / len(xs) * (1 if split == 'train' else 2)"
            ),
            code("def report(split):\n    return round(split_loss(split), 3)"),
            code("first_train = split_loss('train')\nfirst_report = report('valid')"),
            md("## A better loss"),
            code("SCALE = 3.0"),
            code("def split_loss(split):\n    return math.sqrt(SCALE * sum(x * x for x in xs))"),
            code("second_train = split_loss('train')\nsecond_report = report('valid')"),
            md("## Plots"),
            code("print('losses', first_train, second_train)\nfor x in xs:\n    print(x)"),
        ],
    )


def dataflow_globals() -> None:
    save(
        "dataflow_globals.ipynb",
        [
            md("# Globals\nState that functions share through the module."),
            code("global_step = 0\nlayers = []"),
            code(
                "def step(n):\n    global global_step\n    global_step += n\n    return global_step"
            ),
            code("def add_layer(width):\n    global layers\n    layers = layers + [width]"),
            md("## Train"),
            code("for i in range(4):\n    step(i)\n    add_layer(i * 2)\nfinal_step = global_step"),
            code("n_layers = float(len(layers))"),
            md("## Padding"),
            code("max_length = int('5')"),
            code("def pad(seq):\n    return (seq + [0] * max_length)[:max_length]"),
            code(
                "padded = list(map(pad, [[1, 2], [3, 4, 5, 6, 7, 8]]))\ntotal = float(sum(map(sum, padded)))"
            ),
            md("## Scaling"),
            code(
                "class Scaler:\n"
                "    def __init__(self, k):\n"
                "        self.k = k\n\n"
                "    def __call__(self, x):\n"
                "        return x * self.k * width"
            ),
            code("width = float(len(padded))\nscaled = Scaler(2)(3.0)"),
            code("offset = float(len('abc'))\ndef shift(x):\n    return x + offset"),
            code("class Shifter:\n    def apply(self, x):\n        return shift(x) * 2"),
            code("shifted = Shifter().apply(1.0)"),
        ],
    )


def dataflow_names() -> None:
    save(
        "dataflow_names.ipynb",
        [
            md("# Names\nHelpers from a star import, a shadowed import, a class used everywhere."),
            code("%%writefile helpers.py\ndef double(x):\n    return 2 * x\n\n\nHALF = 0.5\n"),
            code("from helpers import *\nfrom math import floor"),
            code("try:\n    import json\nexcept ImportError:\n    json = None"),
            md("## Data"),
            code(
                "class Vocab:\n"
                "    def __init__(self, words):\n"
                "        self.index = {w: i for i, w in enumerate(sorted(set(words)))}\n\n"
                "    def __len__(self):\n"
                "        return len(self.index)"
            ),
            code("def load_vocab(text):\n    return Vocab(text.split())"),
            code("def floor(x):\n    return int(x) - (1 if x < int(x) else 0)"),
            code("vocab = load_vocab('a b c a b')\nsize = float(len(vocab))"),
            code("def described(v=vocab):\n    return float(len(v.index))"),
            code("n_words = described()"),
            md("## Model"),
            code("def tokenize(text):\n    return [vocab.index.get(w, 0) for w in text.split()]"),
            code("def embed(text):\n    return [double(t) * HALF for t in tokenize(text)]"),
            code("weights = embed('c b a')\nlowest = float(floor(-0.5))"),
            code("encoded = float(len(json.dumps(weights)))"),
            code("def never_called():\n    return undefined_thing + 1"),
        ],
    )


def ddp_mlp() -> None:
    save(
        "ddp_mlp.ipynb",
        [
            md("# Tiny MLP\nSynthetic regression, small enough to train data-parallel on CPUs."),
            code(
                "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset"
            ),
            code("SEED = 0\nN_SAMPLES = 256\nBATCH_SIZE = 32\nEPOCHS = 3\nLR = 0.1"),
            code('CHECKPOINT = "mlp.pt"'),
            md("## Data"),
            code(
                "g = torch.Generator().manual_seed(SEED)\n"
                "x = torch.randn(N_SAMPLES, 8, generator=g)\n"
                "y = torch.sin(x @ torch.randn(8, 1, generator=g))\n"
                "loader = DataLoader(TensorDataset(x, y), batch_size=BATCH_SIZE, shuffle=False)"
            ),
            md("## Model"),
            code(
                'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
                "torch.manual_seed(SEED)\n"
                "model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)\n"
                "optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)\n"
                "loss_fn = nn.MSELoss()"
            ),
            md("## Training"),
            code(
                "history = []\n"
                "for epoch in range(EPOCHS):\n"
                "    for xb, yb in loader:\n"
                "        xb, yb = xb.to(device), yb.to(device)\n"
                "        optimizer.zero_grad()\n"
                "        loss = loss_fn(model(xb), yb)\n"
                "        loss.backward()\n"
                "        optimizer.step()\n"
                "        history.append(loss.item())\n"
                '    print(f"epoch {epoch}: loss {loss.item():.5f}")'
            ),
            md("## Saving"),
            code("torch.save(model.state_dict(), CHECKPOINT)"),
        ],
    )


def types_untyped_data() -> None:
    """Tensors from a module the refactor has no types for (a data set's `.data`), recognised by
    the methods only tensors have (`.view(-1, 16)` with sizes, `.long()`, `.unsqueeze(0)`)."""
    save(
        "types_untyped_data.ipynb",
        [
            md("# Untyped data\nA data set from a helper module the refactor cannot see into."),
            code(
                "%%writefile digits.py\nimport torch\n\n\nclass Digits:\n"
                "    data = torch.rand(10, 4, 4)\n    targets = torch.arange(10) % 2\n"
            ),
            code("import torch\nfrom digits import Digits"),
            md("## Data"),
            code(
                "ds = Digits()\nx_train = ds.data[:8].view(-1, 16)\n"
                "y_train = ds.targets[:8].long()\nfirst = ds.data[0].unsqueeze(0)"
            ),
            md("## Model"),
            code(
                "def fit(x, y, epochs=2):\n    w = torch.zeros(16, requires_grad=True)\n"
                "    for _ in range(epochs):\n        loss = ((x @ w) - y.float()).pow(2).mean()\n"
                "        loss.backward()\n    return loss.item()"
            ),
            code("def peek(image):\n    return image.shape"),
            code("final = fit(x_train, y_train)\nshape = peek(first)"),
        ],
    )


def sweep_mlp() -> None:
    save(
        "sweep_mlp.ipynb",
        [
            md("# Learning-rate sweep\nA linear model on synthetic data, its `lr` searched."),
            code("import jupyter_trainmate\nimport torch\nfrom torch import nn"),
            code("SEED = 0\nEPOCHS = 2"),
            md("## Data"),
            code(
                "g = torch.Generator().manual_seed(SEED)\n"
                "x = torch.randn(64, 4, generator=g)\n"
                "y = x @ torch.randn(4, 1, generator=g)\n"
                "batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 48, 16)]\n"
                "x_val, y_val = x[48:], y[48:]"
            ),
            md("## Training"),
            code(
                "%%train --sweep 3 --monitor val_loss --mode min --seed 0\n"
                'lr = jupyter_trainmate.suggest("lr", 1e-3, 1e-1, log=True)\n'
                "torch.manual_seed(SEED)\n"
                "model = nn.Linear(4, 1)\n"
                "optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n"
                "for epoch in range(EPOCHS):\n"
                "    for xb, yb in batches:\n"
                "        optimizer.zero_grad()\n"
                "        loss = nn.functional.mse_loss(model(xb), yb)\n"
                "        loss.backward()\n"
                "        optimizer.step()\n"
                "    with torch.no_grad():\n"
                "        val_loss = nn.functional.mse_loss(model(x_val), y_val).item()\n"
                "    jupyter_trainmate.log(val_loss=val_loss)"
            ),
            code('print("trained with lr", lr, "val_loss", val_loss)'),
        ],
    )


def corpus_imports() -> None:
    """An import path IPython 9 removed (`from IPython.core.display import display`, as
    sksq96/pytorch-vae has it): the package imports `display` from `IPython.display`."""
    save(
        "corpus_imports.ipynb",
        [
            md("# Old IPython imports\nA notebook written for IPython 7."),
            code(
                "import math\nfrom IPython.display import HTML\n"
                "from IPython.core.display import display, clear_output"
            ),
            md("## Numbers"),
            code("radius = 2.0\narea = math.pi * radius**2"),
            md("## Show"),
            code("clear_output()\ndisplay(HTML(f'<b>{area:.2f}</b>'))"),
        ],
    )


def corpus_property() -> None:
    """A property whose own code fails mypy (pytorch_tabular's tutorial 04: `backbone`): the
    refactor's `@no_type_check` goes under `@property`, or building the class raises."""
    save(
        "corpus_property.ipynb",
        [
            md("# A property mypy rejects"),
            code(
                "class Box:\n    def __init__(self, size):\n        self._size = size\n\n"
                "    @property\n    def label(self):\n        parts = [1, 2]\n"
                "        parts.append('x')\n        return 'box'\n\n"
                "    def area(self):\n        return self._size * self._size"
            ),
            md("## Use"),
            code("box = Box(3)\nname = box.label\nsurface = box.area()"),
        ],
    )


def corpus_cuda_method() -> None:
    """A model class whose method calls `.cuda()` outside `__init__` (L1aoXingyu's VAE, second
    wave): the refactor turns it into `.to(device)`, module state of `train`, where the class
    must go with it."""
    save(
        "corpus_cuda_method.ipynb",
        [
            md("# A VAE-like model that moves its noise to the GPU"),
            code("import torch\nfrom torch import nn"),
            code(
                "class Noisy(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.fc = nn.Linear(4, 2)\n\n    def forward(self, x):\n"
                "        eps = torch.randn(x.shape[0], 2)\n        if torch.cuda.is_available():\n"
                "            eps = eps.cuda()\n        return self.fc(x) + 0.0 * eps"
            ),
            code(
                "class Mover(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.where = 'cpu'\n\n    def pick(self):\n"
                "        self.where = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
                "        return self.where"
            ),
            md("## Train"),
            code(
                "torch.manual_seed(0)\nnet = Noisy()\nif torch.cuda.is_available():\n"
                "    net = net.cuda()\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
                "x = torch.randn(8, 4)\nfor step in range(3):\n    loss = net(x).pow(2).mean()\n"
                "    opt.zero_grad()\n    loss.backward()\n    opt.step()"
            ),
            code("final = round(loss.item(), 6)\nprint(final)\nplace = Mover().pick()"),
        ],
    )


def corpus_pip_pins() -> None:
    """`!pip install` lines of real notebooks: a local-version pin from a `-f` index (omarsar's
    gentle introduction, second wave), an option with a value (`--trusted-host HOST`) and a
    shell redirection (`&> log`, yandexdataschool's nlp_course seq2seq)."""
    save(
        "corpus_pip_pins.ipynb",
        [
            md("# Setup\nThe notebook pins the CUDA 9.2 build of torch 1.2."),
            code(
                "!pip3 install torch==1.2.0+cu92 torchvision==0.4.0+cu92 "
                "-f https://download.pytorch.org/whl/torch_stable.html\n"
                "!pip install -q --trusted-host pypi.example.org 'numpy>=1.20'\n"
                "!pip3 install subword-nmt &> log"
            ),
            code("import numpy as np\nimport torch"),
            md("## Fit"),
            code(
                "w = torch.zeros(1, requires_grad=True)\nfor _ in range(5):\n"
                "    loss = (w - 2).pow(2).sum()\n    loss.backward()\n"
                "    with torch.no_grad():\n        w -= 0.5 * w.grad\n    w.grad.zero_()\n"
                "final = np.round(w.item(), 3)"
            ),
        ],
    )


def equiv_unseeded() -> None:
    """No seed anywhere, and `list(set(text))`: both differ from one process to the next."""
    save(
        "equiv_unseeded.ipynb",
        [
            md("# Data"),
            code("import torch\nimport torch.nn as nn"),
            code(
                "text = 'hello trainmate'\nchars = list(set(text))\n"
                "stoi = {c: i for i, c in enumerate(chars)}\nencoded = [stoi[c] for c in text]"
            ),
            md("## Model"),
            code(
                "model = nn.Linear(len(chars), len(chars))\n"
                "opt = torch.optim.SGD(model.parameters(), lr=0.1)"
            ),
            md("## Train"),
            code(
                "x = nn.functional.one_hot(torch.tensor(encoded[:-1]), len(chars)).float()\n"
                "y = torch.tensor(encoded[1:])\nfor step in range(20):\n"
                "    loss = nn.functional.cross_entropy(model(x), y)\n    opt.zero_grad()\n"
                "    loss.backward()\n    opt.step()\nfinal_loss = loss.item()"
            ),
        ],
    )


def equiv_local_data() -> None:
    """Data read from a file beside the notebook; a model saved beside it."""
    rows = [f"{x / 10:.1f},{3 * x / 10 + 1:.1f}" for x in range(20)]
    (HERE / "equiv_local_data.csv").write_text("\n".join(rows) + "\n")
    save(
        "equiv_local_data.ipynb",
        [
            md("# Data"),
            code("import numpy as np\nimport torch"),
            code(
                "xy = np.loadtxt('equiv_local_data.csv', delimiter=',')\n"
                "x = torch.tensor(xy[:, :1], dtype=torch.float32)\n"
                "y = torch.tensor(xy[:, 1:], dtype=torch.float32)"
            ),
            md("## Train"),
            code(
                "torch.manual_seed(0)\nmodel = torch.nn.Linear(1, 1)\n"
                "opt = torch.optim.SGD(model.parameters(), lr=0.05)\nfor step in range(50):\n"
                "    loss = torch.nn.functional.mse_loss(model(x), y)\n    opt.zero_grad()\n"
                "    loss.backward()\n    opt.step()\nfinal_loss = loss.item()\n"
                "torch.save(model.state_dict(), 'model.pt')"
            ),
        ],
    )


if __name__ == "__main__":
    equiv_unseeded()
    equiv_local_data()
    corpus_pip_pins()
    corpus_cuda_method()
    corpus_property()
    corpus_imports()
    sweep_mlp()
    ddp_mlp()
    dataflow_versions()
    dataflow_globals()
    dataflow_names()
    types_untyped_data()
    kitchen_sink()
    realistic()
    nbdev_style()
    old_v3()
