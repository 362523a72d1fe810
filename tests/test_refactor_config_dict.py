"""A notebook's configuration dict (jinglescode's stock-price LSTM: `config = {"data": {...},
"model": {...}, "training": {...}}`, all literals) is a field of `Config`, set on the command
line as a JSON object merged over the notebook's. Before, a section built the dict and `Config`
had none of the notebook's hyperparameters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

from tests.test_refactor_wave3 import refactored_clean, run_value

CELLS = [
    new_code_cell("import torch\nfrom torch import nn"),
    new_code_cell(
        "LR = 0.1\n"
        "config = {\n    'model': {'hidden': 8, 'layers': [3, 1]},\n"
        "    'training': {'epochs': 2, 'lr': 0.05, 'device': 'cpu'},\n    'name': 'demo',\n}\n"
        "labels = {1: 'one', 2: 'two'}  # not string keys: state, as before"
    ),
    new_markdown_cell("## Model"),
    new_code_cell(
        "torch.manual_seed(0)\n"
        "net = nn.Sequential(nn.Linear(3, config['model']['hidden']), "
        "nn.Linear(config['model']['hidden'], 1))\n"
        "config['training']['lr'] = config['training']['lr'] * 2  # the next section sees it"
    ),
    new_markdown_cell("## Train"),
    new_code_cell(
        "opt = torch.optim.SGD(net.parameters(), lr=config['training']['lr'] + LR)\n"
        "for _ in range(config['training']['epochs']):\n"
        "    loss = net(torch.ones(4, 3)).sum()\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        "final = round(loss.item(), 5)\nused = opt.param_groups[0]['lr']\nname = labels[1]"
    ),
]


def _notebook_values() -> tuple[float, float]:
    """What the notebook's cells compute, run here as one script."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05 * 2 + 0.1)
    for _ in range(2):
        loss = net(torch.ones(4, 3)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return round(loss.item(), 5), opt.param_groups[0]["lr"]


def test_a_dict_of_literals_is_a_config_field_set_from_json(tmp_path: Path) -> None:
    out = refactored_clean(tmp_path, "dictcfg", CELLS)
    final, used = _notebook_values()
    shown = run_value(out, "dictcfg", "result['final'], result['used'], result['name']")
    assert shown == f"{final} {used} one"  # the mutation in one section reaches the next
    config = (out / "dictcfg" / "config.py").read_text()
    assert "config: dict[str, Any] = _field(default_factory=lambda: _copy.deepcopy(config))" in (
        config
    )
    assert "labels" not in config
    # each Config gets its own copy: a run that changed its dict leaves the next one's alone
    probe = (
        "from dictcfg.config import Config\nfrom dictcfg.train import run\n"
        "a = Config()\nrun(a)\nprint(a.config['training']['lr'], Config().config['training']['lr'])\n"
        "from dictcfg import __main__ as cli\nimport dictcfg.train as t\nseen = []\n"
        "t.run = seen.append\n"
        "cli.main(['train', '--config', '{\"training\": {\"epochs\": 3}, \"extra\": [1]}'])\n"
        "print(seen[0].config['training'], seen[0].config['extra'], seen[0].config['name'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=out, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "0.1 0.05",
        "{'epochs': 3, 'lr': 0.05, 'device': 'cpu'} [1] demo",  # merged key by key
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "dictcfg", "train", "--config", "[1, 2]"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].endswith("argument --config: not a JSON object")
