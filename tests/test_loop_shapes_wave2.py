"""Loop shapes from the second wave of public training notebooks (issues 14/15: the notebooks
added to benchmarks/loops_corpus.toml on branch loops2) that showed a failure class: each test
is the notebook's shape, tiny, trained for real on the CPU, bit-identical to the plain run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError

from jupyter_trainmate import last_run
from jupyter_trainmate.runtime.checkpoint import checkpoints

from .train_harness import COMMON, assert_parity, fresh_shell, interrupt_then_resume, run, weights

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


SPLIT_IN_THE_CELL = """
import numpy as np
np.random.seed(0)
k = 0
STOP = -1
"""

SHUFFLE_THEN_TRAIN = """
order = np.random.permutation(256)  # a data split drawn in the training cell, before its loop
split = DataLoader(TensorDataset(x[order[:160]], y[order[:160]]), batch_size=32, shuffle=True)
for epoch in range(2):
    for xb, yb in split:
        k += 1
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if k == STOP:
            raise KeyboardInterrupt
        opt.step()
"""


def test_resume_draws_what_the_cell_draws_before_its_loop_as_the_interrupted_run_did(
    tmp_path: Path,
) -> None:
    """Bjarten/early-stopping-pytorch: `create_datasets()` in the training cell shuffles the
    indices with np.random before the loop (dair-ai's nn-lm shuffles its sentences with
    random.shuffle). The resumed run drew them from wherever the kernel's generators were after
    the interruption: another split, other weights. The generators go back to the run's start."""
    expected = weights(run([COMMON, SPLIT_IN_THE_CELL, SHUFFLE_THEN_TRAIN], None))
    ip = interrupt_then_resume([COMMON, SPLIT_IN_THE_CELL], SHUFFLE_THEN_TRAIN, tmp_path)
    got = weights(ip)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []


MODEL_IN_THE_CELL = """
net = nn.Linear(8, 2)
opt_net = torch.optim.Adam(net.parameters(), lr=0.01)
for epoch in range(2):
    for xb, yb in loader:
        k += 1
        opt_net.zero_grad()
        loss_fn(net(xb), yb).backward()
        if k == STOP:
            raise KeyboardInterrupt
        opt_net.step()
"""


def test_resume_loads_a_model_and_optimizer_the_cell_makes_anew(tmp_path: Path) -> None:
    """huggingface/diffusion-models-class unit 1 (and dair-ai's bow): the model and optimizer
    are made in the training cell. The checkpoint went into the old ones, the cell made fresh
    ones, and `--resume` trained those from the resumed position as if nothing were wrong; then
    it was refused in one line at the first step. The checkpoint's states now go into the new
    ones where the run picks up: bit-identical to the uninterrupted plain run."""
    setup = [COMMON, "k = 0\nSTOP = -1\n"]
    expected = weights(run([*setup, MODEL_IN_THE_CELL], None))
    ip = interrupt_then_resume(setup, MODEL_IN_THE_CELL, tmp_path)
    got = weights(ip)
    assert [name for name in expected if not torch.equal(expected[name], got[name])] == []
    summary = last_run()
    assert summary is not None
    assert any("net, opt_net made by the cell" in e for e in summary.events), summary.events


def test_resume_after_a_restart_finds_the_model_the_training_cell_makes(tmp_path: Path) -> None:
    """After a kernel restart only the earlier cells ran again: `net` and `opt_net` are not
    there until the training cell makes them."""
    setup = [COMMON, "k = 0\nSTOP = -1\n"]
    expected = weights(run([*setup, MODEL_IN_THE_CELL], None))

    def restart(namespace: dict[str, Any]) -> None:
        del namespace["net"], namespace["opt_net"]

    ip = interrupt_then_resume(setup, MODEL_IN_THE_CELL, tmp_path, restart)
    got = weights(ip)
    assert [name for name in expected if not torch.equal(expected[name], got[name])] == []


OPTIMIZER_IN_THE_FUNCTION = """
def fit(model_inp, epochs=2):
    global k
    optimizer = torch.optim.RMSprop(model_inp.parameters(), lr=0.01)
    for epoch in range(epochs):
        for xb, yb in loader:
            k += 1
            optimizer.zero_grad()
            loss_fn(model_inp(xb), yb).backward()
            if k == STOP:
                raise KeyboardInterrupt
            optimizer.step()
"""


def test_resume_refuses_an_optimizer_made_inside_the_function_the_cell_calls(
    tmp_path: Path,
) -> None:
    """pytorch/captum House_Prices_Regression_Interpret: `train(model_inp)` makes its RMSprop
    inside. It is no notebook variable, so no checkpoint holds its state; the resumed run
    went on with a fresh one (other weights), without a word. The interrupted run now says
    so and writes none (it wrote one, and the resumed run refused at its first step)."""
    events: list[str] = []
    with pytest.raises(UsageError, match="--resume: no checkpoint in"):
        interrupt_then_resume(
            [COMMON, "k = 0\nSTOP = -1\n", OPTIMIZER_IN_THE_FUNCTION],
            "fit(model)\n",
            tmp_path,
            events=events,
        )
    assert "no checkpoint written: the run steps an optimizer that is not a notebook" in events[0]
    assert checkpoints(tmp_path) == []


def test_a_sweep_trial_that_steps_no_optimizer_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytorch/captum House_Prices_Regression_Interpret under `--sweep --space lr=...`: the
    first trial trains and saves the model, the second finds the file and loads it instead. The
    error said no stepped optimizer had an `lr`, as if the setting were misspelt; it says the
    trial stepped none, and why that happens."""
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    cell = f"""
import os
if os.path.exists({str(tmp_path / "model.pt")!r}):
    model.load_state_dict(torch.load({str(tmp_path / "model.pt")!r}))
else:
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    torch.save(model.state_dict(), {str(tmp_path / "model.pt")!r})
"""
    monkeypatch.chdir(tmp_path)  # the sweep's journal and run records
    line = '--sweep 2 --monitor loss --space "lr=0.01..0.1" --prune none --display off'
    result = ip.run_cell(f"%%train {line}\n{cell}")
    error = result.error_in_exec
    assert isinstance(error, UsageError)
    assert "--space lr: no optimizer the cell stepped: this trial stepped none" in str(error)
    assert "\n" not in str(error)


def test_an_interrupted_while_loop_says_it_wrote_no_checkpoint(tmp_path: Path) -> None:
    """GunhoChoi's style transfer: `while run[0] <= steps:` around an LBFGS step makes no batches
    and has no passes to count on. A Ctrl-C under --checkpoint wrote none and said nothing;
    `--resume` then found no checkpoint. The interrupted run says so. (`for step in range(n):`
    drawing its own batches is checkpointed by its passes: tests/test_step_loop_checkpoints.py.)"""
    cell = """
step = 0
while step < 20:
    xb = torch.randn(16, 8)
    opt.zero_grad()
    loss_fn(model(xb), (xb[:, 0] > 0).long()).backward()
    opt.step()
    step += 1
    if step == 5:
        raise KeyboardInterrupt
"""
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(f"%%train --checkpoint {tmp_path} --display off\n{cell}")
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "interrupted"
    assert any("interrupted: no checkpoint written" in event for event in summary.events)
    assert checkpoints(tmp_path) == []


TRAIN_FUNCTION = """
val_loader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16, shuffle=True)
k = 0
STOP = -1

def train(model, dataloader, optim, loss_func):
    global k
    model.train()
    for xb, yb in dataloader:
        k += 1
        optim.zero_grad()
        loss_func(model(xb), yb).backward()
        if k == STOP:
            raise KeyboardInterrupt
        optim.step()

def validate(model, dataloader, loss_func):
    model.eval()
    with torch.no_grad():
        return sum(loss_func(model(xb), yb).item() for xb, yb in dataloader)
"""

EPOCHS_IN_THE_CELL = """
for ep in range(3):
    train(model, loader, opt, loss_fn)
    validation_loss = validate(model, val_loader, loss_fn)
"""


def test_resume_in_a_later_epoch_when_the_epoch_loop_calls_the_batch_loop(tmp_path: Path) -> None:
    """PacktPublishing/Mastering-PyTorch chapter 4: `for ep in range(num_epochs):
    train(rnn_model, train_dataloader, optim, loss_func); validate(...)`. The epoch loop is a
    counter loop (the batch loop is in the function), and a resume in epoch 2 ran the finished
    epoch 1 again before the rest: more steps, other weights. It skips it, as an epoch loop that
    holds its batch loop does."""
    expected = weights(run([COMMON, TRAIN_FUNCTION, EPOCHS_IN_THE_CELL], None))
    ip = fresh_shell()
    for source in (COMMON, TRAIN_FUNCTION):
        ip.run_cell(source).raise_error()
    ip.user_ns["STOP"] = 11  # the 3rd batch of epoch 2 (8 an epoch)
    line = f"--checkpoint {tmp_path} --display off"
    ip.run_cell(f"%%train {line}\n{EPOCHS_IN_THE_CELL}")
    interrupted = last_run()
    assert interrupted is not None
    assert interrupted.outcome == "interrupted"
    ip.user_ns["STOP"] = -1
    ip.run_cell(f"%%train {line} --resume\n{EPOCHS_IN_THE_CELL}").raise_error()
    resumed = last_run()
    assert resumed is not None
    assert resumed.optimizer_steps == 24 - 10
    got = weights(ip)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []


SHUFFLED_IN_PLACE = """
for epoch in range(2):
    random.shuffle(sentences)
    for i, sentence in enumerate(sentences):
        k += 1
        loss = sentence_loss(sentence)
        opt.zero_grad()
        loss.backward()
        if k == STOP:
            raise KeyboardInterrupt
        opt.step()
"""


@pytest.mark.parametrize("stop", [6, 17], ids=["epoch-1", "epoch-2"])
def test_resume_puts_back_the_order_of_a_list_the_cell_shuffles_in_place(
    stop: int, tmp_path: Path
) -> None:
    """dair-ai nn-lm: `random.shuffle(train_data)` reorders the notebook's own list before each
    epoch's batch loop. The resumed run shuffled the list from the order the interrupted run had
    left it in (the generators put back, but not the list), so it trained on another order and
    ended with other weights. A mid-epoch checkpoint now holds the list's order as the epoch's
    loop began, and `--resume` puts it back in place."""
    setup = SENTENCES + "\nk = 0\nSTOP = -1\n"
    expected = weights(run([COMMON, setup, SHUFFLED_IN_PLACE], None))
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(setup).raise_error()
    ip.user_ns["STOP"] = stop
    line = f"--checkpoint {tmp_path} --display off"
    ip.run_cell(f"%%train {line}\n{SHUFFLED_IN_PLACE}")
    ip.user_ns["STOP"] = -1
    ip.run_cell(f"%%train {line} --resume\n{SHUFFLED_IN_PLACE}").raise_error()
    got = weights(ip)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []
