"""Real loop shapes under `%%train`: each runs, ends bit-identical to the plain run (CPU, defaults),
and is instrumented where its shape allows."""

from __future__ import annotations

import pytest

from jupyter_trainmate import last_run

from .train_harness import COMMON, assert_parity, fresh_shell


def instrumented(summary: object) -> str:
    return "\n".join(summary.instrumented)  # type: ignore[attr-defined]


def test_tuple_batches_with_per_epoch_scheduler() -> None:
    loop = """
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
for epoch in range(3):
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    sched.step()
"""
    summary, ip = assert_parity([COMMON, loop])
    assert summary.epochs == 3
    assert summary.steps == 3 * 8
    assert summary.optimizer_steps == 24
    assert summary.samples == 3 * 256
    assert 0 <= summary.data_wait_share < 1
    assert summary.amp == "off"
    assert ip.user_ns["opt"].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    assert "batch loop over loader" in instrumented(summary)


DICT_SETUP = """
from dataclasses import dataclass

@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor

class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 2))
    def forward(self, features, labels):
        logits = self.net(features)
        return Output(nn.functional.cross_entropy(logits, labels), logits)

class Dicts(torch.utils.data.Dataset):
    def __len__(self): return len(x)
    def __getitem__(self, i): return {"features": x[i], "labels": y[i]}

model = Classifier()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
dict_loader = DataLoader(Dicts(), batch_size=32, shuffle=True)
device = torch.device("cpu")
"""


def test_dict_batches_model_kwargs_and_outputs_loss() -> None:
    loop = """
for epoch in range(2):
    for step, batch in enumerate(dict_loader, start=1):
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        outputs = model(**batch)
        outputs.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
last_step = step
"""
    summary, ip = assert_parity([COMMON, DICT_SETUP, loop])
    assert ip.user_ns["last_step"] == 8  # enumerate(start=1) kept outside the wrapper
    assert summary.steps == 16
    assert summary.samples == 2 * 256


def test_object_batches_from_a_collate_function() -> None:
    setup = """
from dataclasses import dataclass

@dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor
    ids: list

def collate(items):
    return Batch(torch.stack([a for a, _ in items]), torch.stack([b for _, b in items]), list(range(len(items))))

obj_loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, collate_fn=collate)
"""
    loop = """
for batch in obj_loader:
    opt.zero_grad()
    loss = loss_fn(model(batch.inputs.to(dtype=torch.float32)), batch.targets)
    loss.backward()
    opt.step()
"""
    summary, _ = assert_parity([COMMON, setup, loop])
    assert summary.steps == 16
    assert summary.samples == 256


def test_tqdm_wrapper_keeps_its_progress_bar() -> None:
    loop = """
from tqdm.auto import tqdm
for epoch in range(2):
    for xb, yb in tqdm(loader, desc=f"epoch {epoch}", disable=True):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
"""
    summary, _ = assert_parity([COMMON, loop])
    assert "tqdm(loader" in instrumented(summary)
    assert summary.steps == 16


def test_loop_in_a_function_defined_in_an_earlier_cell() -> None:
    functions = """
def train_step(model, xb, yb):
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    return loss.item()

def train_epoch(model, loader):
    model.train()
    losses = [train_step(model, xb, yb) for xb, yb in loader]
    for xb, yb in loader:
        losses.append(train_step(model, xb, yb))
    return sum(losses) / len(losses)
"""
    loop = """
history = [train_epoch(model, loader) for _ in range(2)]
"""
    summary, ip = assert_parity([COMMON, functions, loop])
    text = instrumented(summary)
    assert "function train_step" in text
    assert "function train_epoch" in text
    assert summary.optimizer_steps == 2 * 16
    # the notebook's own functions are back after the cell
    assert ip.user_ns["train_epoch"].__code__.co_filename.startswith("<ipython-input")


TRAINER = """
class Trainer:
    def __init__(self, model, opt, loader):
        self.model, self.opt, self.loader = model, opt, loader
        self.__batches = 0  # private: the rewritten method must keep the class's name mangling

    def one_batch(self, xb, yb):
        self.opt.zero_grad()
        loss_fn(self.model(xb), yb).backward()
        self.opt.step()

    def fit(self, epochs):
        for _ in range(epochs):
            for xb, yb in self.loader:
                self.one_batch(xb, yb)
                self.__batches += 1
        return self.__batches

class ClippingTrainer(Trainer):
    def one_batch(self, xb, yb):  # two method calls deep, through super()
        super().one_batch(xb, yb)

trainer = ClippingTrainer(model, opt, loader)
fit = trainer.fit
"""


def test_class_method_loop_is_instrumented_bit_identical_and_restored() -> None:
    summary, ip = assert_parity([COMMON, TRAINER, "batches = trainer.fit(2)"])
    text = instrumented(summary)
    assert "method Trainer.fit line 13: batch loop over self.loader" in text
    assert "method Trainer.one_batch line 8: loss_fn(self.model(xb), yb).backward()" in text
    assert summary.steps == 16
    assert summary.epochs == 2
    assert summary.optimizer_steps == 16
    assert ip.user_ns["batches"] == 16
    trainer_cls = ip.user_ns["Trainer"]
    assert vars(trainer_cls)["fit"].__code__.co_filename == ip.user_ns["fit"].__code__.co_filename
    assert "__trainmate__" not in vars(trainer_cls)["fit"].__code__.co_names  # the user's own
    # a name holding the bound method runs it rewritten too, and is given back after
    bound = ip.user_ns["fit"]
    ip.run_cell("%%train\nfit(1)\n").raise_error()
    run = last_run()
    assert run is not None
    assert run.steps == 8
    assert ip.user_ns["fit"] is bound


def test_class_method_is_restored_when_the_cell_raises() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(TRAINER).raise_error()
    classes = [ip.user_ns["Trainer"], ip.user_ns["ClippingTrainer"]]
    before = [dict(vars(cls)) for cls in classes]
    result = ip.run_cell("%%train\ntrainer.fit(1)\nraise RuntimeError('boom')\n")
    assert isinstance(result.error_in_exec, RuntimeError)
    assert [dict(vars(cls)) for cls in classes] == before
    summary = last_run()
    assert summary is not None
    assert summary.steps == 8


def test_gan_two_optimizers_sum_of_losses_and_critic_steps() -> None:
    setup = """
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
del model, opt
"""
    loop = """
for real, _ in loader:
    for _ in range(3):
        opt_d.zero_grad()
        fake = G(torch.randn(real.shape[0], 4)).detach()
        loss_real = nn.functional.softplus(-D(real)).mean()
        loss_fake = nn.functional.softplus(D(fake)).mean()
        (loss_real + loss_fake).backward()
        opt_d.step()
    opt_g.zero_grad()
    loss_g = nn.functional.softplus(-D(G(torch.randn(real.shape[0], 4)))).mean()
    loss_g.backward()
    opt_g.step()
"""
    summary, _ = assert_parity([COMMON, setup, loop])
    assert summary.steps == 8
    assert sorted(summary.optimizer_steps_by_optimizer) == [8, 24]
    assert "loop over range(3)" in "\n".join(summary.left_alone)


@pytest.mark.parametrize(
    "body",
    [
        "opt.zero_grad()\n    loss = loss_fn(model(xb), yb)\n    loss.backward()\n    opt.step()",
        "loss = loss_fn(model(xb), yb)\n    opt.zero_grad()\n    loss.backward()\n    opt.step()",
        "loss = loss_fn(model(xb), yb)\n    loss.backward()\n    opt.step()\n    opt.zero_grad(set_to_none=True)",
        "model.zero_grad()\n    loss = loss_fn(model(xb), yb)\n    loss.backward()\n    opt.step()",
    ],
    ids=["before-forward", "between", "after-step", "on-model"],
)
def test_zero_grad_anywhere(body: str) -> None:
    loop = f"for xb, yb in loader:\n    {body}\n"
    summary, _ = assert_parity([COMMON, loop])
    assert summary.optimizer_steps == 8


def test_manual_update_without_an_optimizer() -> None:
    loop = """
for xb, yb in loader:
    model.zero_grad()
    loss_fn(model(xb), yb).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.data -= 0.05 * p.grad
"""
    summary, _ = assert_parity([COMMON, loop])
    assert summary.steps == 8
    assert summary.optimizer_steps == 0


def test_lbfgs_with_a_closure() -> None:
    loop = """
lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
model.eval()
for xb, yb in loader:
    def closure():
        lbfgs.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        return loss
    lbfgs.step(closure)
"""
    summary, _ = assert_parity([COMMON, loop])
    assert summary.optimizer_steps == 8


HAND_ACCUMULATION = """
for i, (xb, yb) in enumerate(loader):
    loss = loss_fn(model(xb), yb) / 2
    loss.backward()
    if (i + 1) % 2 == 0:
        opt.step()
        opt.zero_grad()
"""


def test_hand_written_accumulation_runs_unchanged() -> None:
    summary, _ = assert_parity([COMMON, HAND_ACCUMULATION])
    assert summary.optimizer_steps == 4


def test_accumulate_is_refused_on_a_hand_accumulating_loop() -> None:
    from IPython.core.error import UsageError

    from .train_harness import run

    with pytest.raises(UsageError, match="already accumulates gradients by hand"):
        run([COMMON, HAND_ACCUMULATION], "--accumulate 2")


def test_per_batch_scheduler_and_lr_written_into_param_groups() -> None:
    loop = """
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=2 * len(loader))
for epoch in range(2):
    for group in opt.param_groups:
        group["weight_decay"] = 1e-4 * (epoch + 1)
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        opt.step()
        sched.step()
"""
    summary, _ = assert_parity([COMMON, loop])
    assert "clip_grad_norm_()" in instrumented(summary)
    assert summary.optimizer_steps == 16


def test_validation_under_no_grad_and_inference_mode_mid_training() -> None:
    loop = """
accuracies = []
for epoch in range(2):
    model.train()
    for i, (xb, yb) in enumerate(loader):
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        if i == 3:
            model.eval()
            with torch.no_grad():
                accuracies.append((model(x).argmax(1) == y).float().mean().item())
            model.train()
    model.eval()
    with torch.inference_mode():
        accuracies.append((model(x).argmax(1) == y).float().mean().item())
    print(f"epoch {epoch}: loss {loss.item():.4f}")
"""
    summary, ip = assert_parity([COMMON, loop])
    assert len(ip.user_ns["accuracies"]) == 4
    assert summary.steps == 16  # the validation batches are not training steps


def test_while_loop_with_next_and_restarts() -> None:
    loop = """
it = iter(loader)
step = 0
while step < 20:
    try:
        xb, yb = next(it)
    except StopIteration:
        it = iter(loader)
        continue
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
    step += 1
"""
    summary, _ = assert_parity([COMMON, loop])
    assert "next() on a batch iterator" in instrumented(summary)
    assert summary.steps == 20
    assert summary.optimizer_steps == 20


def test_in_memory_tensors_by_random_indices_and_slices() -> None:
    loop = """
for epoch in range(2):
    perm = torch.randperm(len(x))
    for start in range(0, len(x), 32):
        idx = perm[start:start + 32]
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
for start in range(0, len(x), 64):
    opt.zero_grad()
    loss_fn(model(x[start:start + 64]), y[start:start + 64]).backward()
    opt.step()
"""
    summary, _ = assert_parity([COMMON, loop])
    assert summary.optimizer_steps == 16 + 4
    assert summary.steps == 20  # no batch iterator: counted by backward()


def test_autograd_grad_penalty_with_create_graph() -> None:
    loop = """
for xb, yb in loader:
    xb = xb.requires_grad_(True)
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    (grad,) = torch.autograd.grad(loss, xb, create_graph=True)
    total = loss + 0.1 * grad.pow(2).sum(dim=1).mean()
    total.backward()
    opt.step()
"""
    summary, _ = assert_parity([COMMON, loop])
    assert summary.optimizer_steps == 8


def test_item_every_step() -> None:
    loop = """
losses = []
for xb, yb in loader:
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    losses.append(loss.item())
"""
    _, ip = assert_parity([COMMON, loop])
    assert len(ip.user_ns["losses"]) == 8


def test_break_and_continue_in_the_batch_loop_keep_their_meaning() -> None:
    """The out-of-memory retry point nests the body in a loop of its own: `break` must still
    leave the batch loop (and skip its `else`), `continue` still move to the next batch."""
    cell = """
seen = 0
for epoch in range(3):
    for i, (xb, yb) in enumerate(loader):
        if i == 1:
            continue
        if i == 4:
            break
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
        seen += 1
    else:
        seen += 100
"""
    _, ip = assert_parity([COMMON, cell])
    assert ip.user_ns["seen"] == 3 * 3  # batches 0, 2, 3 of each epoch; never the else


FIT = """
def fit(epochs):
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()

def execute_example(fn):
    return fn(2)
"""


@pytest.mark.parametrize(
    "loop",
    ["%time fit(2)", "execute_example(fit)", "%%time\nfor _ in range(2):\n    fit(1)\n"],
)
def test_loops_reached_through_time_magics_and_function_arguments(loop: str) -> None:
    summary, _ = assert_parity([COMMON, FIT, loop])
    assert summary.steps == 16
    assert summary.optimizer_steps == 16
    assert "function fit line 3: batch loop over loader" in instrumented(summary)


def test_show_says_what_it_cannot_reach_and_why(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(FIT).raise_error()
    ip.run_cell(
        "%%writefile trainlib.py\ndef fit_module(model, opt, loader, loss_fn):\n"
        "    for xb, yb in loader:\n        loss_fn(model(xb), yb).backward()\n"
        "        opt.step()\n"
    ).raise_error()
    ip.run_cell("import sys; sys.path.insert(0, '.'); import trainlib").raise_error()
    try:
        capsys.readouterr()
        ip.run_cell(
            "%%train --show\n%timeit -n1 -r1 fit(1)\n"
            "trainlib.fit_module(model, opt, loader, loss_fn)\n"
        ).raise_error()
    finally:
        ip.run_cell("sys.path.remove('.'); del sys.modules['trainlib']").raise_error()
    out = capsys.readouterr().out
    assert "nothing: the cell runs unchanged" not in out
    assert (
        "# left alone   cell line 1: %timeit -n1 -r1 fit(1) (the line magic runs this code "
        "itself; %%train cannot rewrite it" in out
    )
    assert "trainlib.fit_module() from " in out
    assert "trainlib.py (code in imported modules is not rewritten" in out
