"""The two forms of the session's per-step calls: `backward(loss)`, `zero_grad(opt)`,
`step(opt, ...)` for calls with positional arguments or none, and their `_kw` forms for calls
with keywords (see `TrainSession.backward`). Each form trains bit-identically to the plain cell."""

from __future__ import annotations

from jupyter_trainmate.rewrite import rewrite_cell

from .train_harness import COMMON, assert_parity


def test_the_rewrite_picks_the_keyword_form_only_for_keyword_calls() -> None:
    code = rewrite_cell(
        "for xb, yb in loader:\n"
        "    opt.zero_grad(set_to_none=False)\n"
        "    loss = loss_fn(model(xb), yb)\n"
        "    loss.backward(None, True)\n"
        "    loss.backward(**{'retain_graph': False})\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n",
        {},
    ).code
    assert "__trainmate__.zero_grad_kw(opt, set_to_none=False)" in code
    assert "__trainmate__.backward(loss, None, True)" in code
    assert "__trainmate__.backward_kw(loss, **{'retain_graph': False})" in code
    assert "__trainmate__.step(opt)" in code
    assert "__trainmate__.zero_grad(opt)" in code


def test_positional_and_keyword_forms_train_as_the_plain_cell() -> None:
    # backward twice through one graph (positional retain_graph, then the keyword form), gradients
    # kept as zero tensors (set_to_none=False), a closure step (LBFGS, positional) and a
    # scheduler step: the same weights as the plain cell, and every optimizer step counted.
    loop = """
lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(xb), yb)
        loss.backward(None, True)
        loss.backward(retain_graph=False)
        opt.step()
    sched.step()
    def closure():
        lbfgs.zero_grad()
        out = loss_fn(model(xb), yb)
        out.backward()
        return out
    lbfgs.step(closure)
"""
    summary, ip = assert_parity([COMMON, loop])
    assert summary.epochs == 2
    assert summary.optimizer_steps == 2 * 8 + 2
    assert all(p.grad is not None for p in ip.user_ns["model"].parameters())
