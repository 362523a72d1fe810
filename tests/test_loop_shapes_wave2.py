"""Loop shapes from the second wave of public training notebooks (issues 14/15: the notebooks
added to benchmarks/loops_corpus.toml on branch loops2) that showed a failure class: each test
is the notebook's shape, tiny, trained for real on the CPU, bit-identical to the plain run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError

from jupyter_trainmate import last_run

from .train_harness import COMMON, assert_parity, fresh_shell, run, weights

SENTENCES = """
sentences = [torch.randint(0, 20, (int(n),)).tolist() for n in torch.randint(3, 8, (12,))]
model = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 20))
opt = torch.optim.Adam(model.parameters(), lr=0.01)

def sentence_loss(sentence):
    return loss_fn(model(torch.tensor(sentence[:-1])), torch.tensor(sentence[1:]))
"""


def test_batches_that_are_lists_of_token_ids_say_samples_were_not_counted() -> None:
    """dair-ai/ML-Notebooks nn-lm-batch: the batch loop iterates a Python list of sentences (lists
    of ints) and builds each step's tensors itself. There is no tensor to take a first dimension
    from, so the summary says samples were not counted, not "~0 samples (a guess)"."""
    cell = """
for epoch in range(2):
    random.shuffle(sentences)
    for i, sentence in enumerate(sentences):
        loss = sentence_loss(sentence)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    summary, _ = assert_parity([COMMON, SENTENCES, cell])
    assert (summary.steps, summary.epochs, summary.optimizer_steps) == (24, 2, 24)
    assert summary.samples_source == "none"
    assert "samples not counted" in summary.line()
    assert "~0 samples" not in summary.line()


DICT_BATCHES = """
import numpy as np
from tqdm import tqdm
np.random.seed(0)
features, targets = torch.randn(96, 8), torch.randn(96)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def iterate_minibatches(n, batch_size=16, shuffle=True):
    indices = np.random.permutation(n) if shuffle else np.arange(n)
    for start in range(0, n, batch_size):
        rows = torch.from_numpy(indices[start : start + batch_size])
        yield {"x": features[rows], "y": targets[rows]}
"""


def test_a_loop_iterable_written_over_several_lines_is_one_line_in_the_notes() -> None:
    """yandexdataschool/nlp_course week02: `for i, batch in tqdm(enumerate(\\n generator),\\n
    total=...):`. The notes (`--show`, the summary's `instrumented`) are one line each."""
    cell = """
for epoch in range(2):
    for i, batch in tqdm(enumerate(
            iterate_minibatches(96, batch_size=16)),
            total=96 // 16
        ):
        loss = ((model(batch["x"])[:, 0] - batch["y"]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    summary, _ = assert_parity([COMMON, DICT_BATCHES, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (12, 2, 192)
    loop = [note for note in summary.instrumented if "batch loop over" in note]
    assert loop == [
        "instrumented cell line 2: batch loop over tqdm(enumerate(iterate_minibatches(96, "
        "batch_size=16)), total=96 // 16) (timed; prefetched per --prefetch; retried as "
        "micro-batches on out-of-memory)"
    ]
    assert not any("\n" in note for note in summary.instrumented)


def test_accumulate_with_an_lbfgs_closure_is_refused_in_one_line() -> None:
    """GunhoChoi/Kind-PyTorch-Tutorial style transfer: `while iteration[0] < epoch:` around
    `optimizer.step(closure)`. Under `--accumulate 2` the closure's zero_grad() was skipped and
    its loss halved, so LBFGS summed the gradients of its own re-evaluations and the image came
    out different, silently. The run is refused, in one line, before the first step."""
    cell = """
lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
iteration = [0]
while iteration[0] < 10:
    def closure():
        lbfgs.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        iteration[0] += 1
        return loss
    lbfgs.step(closure)
"""
    refusal = r"--accumulate does not work with optimizer.step\(closure\)"
    with pytest.raises(UsageError, match=refusal) as error:
        run([COMMON, cell], "--accumulate 2")
    assert "\n" not in str(error.value)


STEP_THEN_ZERO = """
for epoch in range(2):
    for xb, yb in loader:
        k += 1
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if k == STOP:
            raise KeyboardInterrupt  # a Ctrl-C while backward() ran, or just after
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("stop", [6, 9], ids=["mid-epoch", "first-batch-of-epoch-2"])
def test_resume_after_a_ctrl_c_between_backward_and_step(stop: int, tmp_path: Path) -> None:
    """dair-ai/ML-Notebooks first_nn: `l.backward(); trainer.step(); trainer.zero_grad()`, a
    Ctrl-C after a backward(). Mid-epoch, that batch's gradients stayed in `.grad` and `--resume`
    in the same kernel redid the batch on top of them (this order zeroes only after the step).
    In an epoch's first batch, the checkpoint kept the generators as they were after the fetch,
    so the resumed epoch drew another shuffle order. Either way the resumed run ended with other
    weights; it ends with the uninterrupted run's, bit for bit."""
    setup = COMMON + "\nk = 0\nSTOP = -1\n"
    expected = weights(run([setup, STEP_THEN_ZERO], None))
    ip = fresh_shell()
    ip.run_cell(setup + f"STOP = {stop}\n").raise_error()
    line = f"--checkpoint {tmp_path} --display off"
    ip.run_cell(f"%%train {line}\n{STEP_THEN_ZERO}")
    interrupted = last_run()
    assert interrupted is not None
    assert interrupted.outcome == "interrupted"
    ip.user_ns["STOP"] = -1
    ip.run_cell(f"%%train {line} --resume\n{STEP_THEN_ZERO}").raise_error()
    got = weights(ip)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []
