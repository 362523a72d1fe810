"""
Training calls: `backward()`, `step()`, `zero_grad()` and gradient clipping go through the session.

`loss.backward()` becomes `__trainmate__.backward(loss)`, `x.step(...)` becomes
`__trainmate__.step(x, ...)`, and so on (a call with keyword arguments goes to the `_kw` form:
`opt.zero_grad(set_to_none=True)` becomes `__trainmate__.zero_grad_kw(opt, set_to_none=True)`;
the plain forms take no `**kwargs`, which would cost every step a dict); torch's deprecated `clip_grad_norm` goes through the
session's `clip_grad_norm_`, as torch's own does. The session decides at run time what each
receiver is (an optimizer, a scheduler, a GradScaler or something else entirely, such as a gym
environment) and passes anything it does not own straight through, so a rewrite never changes
what unknown code does. Every change is inline: line numbers do not move.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .context import SESSION, RewriteContext
from .detect import CLIP

METHODS = {"backward", "step", "zero_grad"}


def _session_call(method: str, args: list[cst.Arg]) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=cst.Name(SESSION), attr=cst.Name(method)), args=args)


class TrainCallTransformer(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, context: RewriteContext) -> None:
        super().__init__()
        self.context = context

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        line = int(self.get_metadata(cst.metadata.PositionProvider, original_node).start.line)
        if isinstance(func, cst.Attribute) and func.attr.value in METHODS:
            receiver = func.value
            if m.matches(receiver, m.Name(SESSION)):
                return updated_node
            method = func.attr.value
            text = cst.Module([]).code_for_node(receiver)
            self.context.instrumented(line, f"{text}.{method}()")
            if any(a.keyword is not None or a.star == "**" for a in updated_node.args):
                method += "_kw"
            return _session_call(method, [cst.Arg(receiver), *updated_node.args])
        name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
        if name in CLIP:
            self.context.instrumented(line, f"{name}()", "unscaled first under fp16, on real steps")
            return _session_call(CLIP[str(name)], list(updated_node.args))
        return updated_node
