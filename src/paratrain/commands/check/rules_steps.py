"""Rules about the optimizer step: mixed precision and gradient accumulation.

PT018 a GradScaler without fp16 autocast, or fp16 autocast without a GradScaler; PT019
gradient accumulation whose loss is not divided by the number of micro-batches.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.patterns import (
    ModuleFacts,
    dotted,
    keyword,
    last_name,
    method,
    module_facts,
)

FP16 = {"torch.float16", "torch.half"}


def _autocasts(facts: ModuleFacts) -> list[tuple[ast.Call, str]]:
    """Every autocast call: torch's, any object's ``.autocast()`` (Accelerate, Fabric), or a
    name set to one (``amp_autocast = partial(torch.autocast, ...)``); a name that is only ever
    ``nullcontext`` (``amp_autocast = nullcontext``, never switched on) is not one."""
    found: list[tuple[ast.Call, str]] = []
    for call, qual in facts.calls():
        if method(call) == "autocast" or qual.endswith(".autocast") or qual == "autocast":
            found.append((call, qual))
        elif qual.endswith("autocast") and isinstance(call.func, ast.Name):
            values = [v for v in facts.values(call.func) if isinstance(v, ast.expr)]
            if not values or any("autocast" in ast.unparse(v) for v in values):
                found.append((call, qual))
        elif qual.endswith("partial") and call.args:
            inner = facts.qualname(call.args[0])
            if inner.endswith("autocast"):  # `partial(torch.autocast, "cuda", dtype=...)`
                made = ast.Call(func=call.args[0], args=call.args[1:], keywords=call.keywords)
                found.append((ast.copy_location(made, call), inner))
    return found


def _helper_for_others(facts: ModuleFacts, node: ast.AST) -> bool:
    """``node`` is in a method, or in a function this module never calls: a loss-scaling
    helper (timm's ``NativeScaler``) whose callers, elsewhere, hold the autocast."""
    scope = facts.scope_of(node)
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    if isinstance(facts.parents.get(scope), ast.ClassDef):
        return True
    return not any(True for _ in facts.references(scope))


def _fp16_autocast(facts: ModuleFacts, call: ast.Call, qual: str) -> bool:
    """``autocast(dtype=torch.float16)`` (or a name set to it), or an autocast on CUDA without
    a dtype: torch.cuda.amp's, ``torch.autocast("cuda")`` (float16 unless told). Not one that
    is switched off (``enabled=False``)."""
    enabled = keyword(call, "enabled")
    if isinstance(enabled, ast.Constant) and enabled.value is False:
        return False
    first = call.args[0] if call.args else None
    off = isinstance(first, ast.Constant) and first.value is False
    if qual == "torch.cuda.amp.autocast" and off:  # its first argument is `enabled`
        return False
    dtype = keyword(call, "dtype")
    if dtype is not None:
        values: list[object] = []
        for v in facts.values(dtype) or [dtype]:
            key = dotted(v) if isinstance(v, ast.expr) else None
            if key and "." in key and not facts.origins.get(key):  # `cfg.amp_dtype`: a field
                values += facts.values_of(key.rsplit(".", 1)[-1]) or [v]
            else:
                values.append(v)
        return all(isinstance(v, ast.expr) and facts.qualname(v) in FP16 for v in values)
    if qual == "torch.cuda.amp.autocast":
        return not call.args
    device = keyword(call, "device_type") or (call.args[0] if call.args else None)
    plain = qual in ("torch.autocast", "torch.amp.autocast") and len(call.args) <= 1
    return plain and isinstance(device, ast.Constant) and device.value == "cuda"


def _mentions_scaler(facts: ModuleFacts) -> bool:
    for node in facts.nodes:
        if isinstance(node, ast.Name) and "scaler" in node.id.lower():
            return True
        if isinstance(node, ast.Attribute) and "scaler" in node.attr.lower():
            return True
        if isinstance(node, ast.keyword) and node.arg and "scaler" in node.arg.lower():
            return True
    return False


def _none(origin: object) -> bool:
    return isinstance(origin, ast.Constant) and origin.value is None


def _is_scaler(facts: ModuleFacts, node: ast.expr) -> bool:
    """A name bound only to ``GradScaler(...)`` (or ``None`` when AMP is off)."""
    key = dotted(node)
    origins = [o for o in facts.values(node) if not _none(o)] if key else []
    return bool(origins) and all(
        isinstance(o, ast.Call) and facts.qualname(o.func).endswith("GradScaler") for o in origins
    )


@rule("PT018", "scaler-autocast-mismatch", "GradScaler without fp16 autocast, or the reverse")
def scaler_autocast_mismatch(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """Loss scaling and fp16 compute come in pairs.

    ``scaler.scale(loss)`` with no autocast anywhere: the model runs in fp32 and the scaling
    does nothing useful. ``autocast(dtype=torch.float16)`` with ``.backward()`` and no
    GradScaler: small fp16 gradients underflow to zero and training stalls or diverges.
    """
    facts = module_facts(tree)
    autocasts = _autocasts(facts)
    if not autocasts:
        for call, _ in facts.calls():
            if (
                method(call) == "scale"
                and isinstance(call.func, ast.Attribute)
                and _is_scaler(facts, call.func.value)
                and not _helper_for_others(facts, call)
            ):
                yield Finding.at(
                    "PT018",
                    call,
                    message="the loss is scaled but nothing runs under autocast: the "
                    "model computes in fp32 and the GradScaler only adds work",
                    fix="run the forward pass under torch.autocast('cuda', "
                    "dtype=torch.float16), or drop the GradScaler",
                    api='pt.Run(precision="fp16") (autocast and loss scaling together)',
                )
        return
    backward = any(method(c) == "backward" for c, _ in facts.calls())
    if not backward or _mentions_scaler(facts):
        return
    for call, qual in autocasts:
        if _fp16_autocast(facts, call, qual):
            yield Finding.at(
                "PT018",
                call,
                message="fp16 autocast with backward() and no GradScaler: small fp16 gradients "
                "underflow to zero",
                fix='scale the loss: scaler = torch.amp.GradScaler("cuda"); '
                "scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update() "
                "(or use dtype=torch.bfloat16)",
                api='pt.Run(precision="fp16") (autocast and loss scaling together)',
            )


LOOPS = (ast.For, ast.AsyncFor, ast.While)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _between(facts: ModuleFacts, node: ast.AST, loop: ast.AST) -> list[ast.AST] | None:
    """The ancestors of ``node`` below ``loop`` (None when ``loop`` is not its innermost loop)."""
    path: list[ast.AST] = []
    for _, parent in facts.ancestors(node):
        if parent is loop:
            return path
        if isinstance(parent, (*LOOPS, *SCOPES)):
            return None
        path.append(parent)
    return None


def _names(node: ast.AST) -> set[str]:
    return {last_name(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def _counters(loop: ast.For | ast.AsyncFor | ast.While) -> set[str]:
    """Names the loop counts with: its targets, and names incremented in its body."""
    found = _names(loop.target) if isinstance(loop, (ast.For, ast.AsyncFor)) else set()
    for stmt in loop.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
                found.add(last_name(node.target))
    return found - {""}


def _counters_of(scope: ast.AST) -> set[str]:
    return {
        last_name(n.target)
        for n in ast.walk(scope)
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
    } - {""}


def _self_counters(facts: ModuleFacts) -> set[str]:
    """``self.x`` attributes set from a loop counter or counted up anywhere in the class
    (``self._inner_iter = i`` in the epoch loop, ``self.step += 1``)."""
    found: set[str] = set()
    for node in facts.nodes:
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            found.add(last_name(node.target))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign) and (dotted(inner.value) or "") in _names(
                    node.target
                ):
                    found |= {last_name(t) for t in inner.targets}
    return found - {""}


def _after_skip(loop: ast.AST) -> set[ast.AST]:
    """The statements of ``loop``'s body after an ``if ...: continue`` (not run every pass)."""
    body: list[ast.stmt] = getattr(loop, "body", [])
    for i, s in enumerate(body):
        if isinstance(s, ast.If) and s.body and isinstance(s.body[-1], ast.Continue):
            return set(body[i + 1 :])
    return set()


def _skips_before(facts: ModuleFacts, step: ast.Call, loop: ast.AST) -> list[ast.expr]:
    """The tests of ``if ...: continue`` before ``step`` in ``loop``'s body (Megatron's
    ``if micro_step % accum != 0: continue`` then ``optimizer.step()``)."""
    body: list[ast.stmt] = getattr(loop, "body", [])
    top = next((s for s in body if any(n is step for n in ast.walk(s))), None)
    if top is None:
        return []
    return [
        s.test
        for s in body[: body.index(top)]
        if isinstance(s, ast.If) and s.body and isinstance(s.body[-1], ast.Continue)
    ]


def _accumulation_count(
    test: ast.AST, counters: set[str], facts: ModuleFacts | None = None
) -> ast.expr | None:
    """``N`` of ``(i + 1) % N == 0`` when the left side uses a loop counter; also through a
    name set so (``sync = (i + 1) % N == 0; if sync:``)."""
    if facts is not None and dotted(test) is not None:
        for value in facts.values(test):
            if isinstance(value, ast.expr) and value is not test:
                found = _accumulation_count(value, counters)
                if found is not None:
                    return found
    for node in ast.walk(test):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mod)
            and _names(node.left) & counters
        ):
            return node.right
    return None


def _divided(facts: ModuleFacts, value: ast.AST, wanted: set[str], depth: int = 0) -> bool:
    """``value`` (a loss) is divided by an expression that uses ``wanted``: ``loss / N``,
    ``loss * (1 / N)``, ``loss.div(N)``, or a name set so (``loss = loss / N``, ``loss /= N``,
    ``loss = compute(...)`` whose return divides)."""
    for node in ast.walk(value):
        divisor: ast.AST | None = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            divisor = node.right
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            # `loss * (1 / N)`
            divisor = node if any(_is_division(n) for n in ast.walk(node)) else None
        elif method(node) in ("div", "div_", "true_divide") and node.args:  # type: ignore[attr-defined]
            divisor = node.args[0]  # type: ignore[attr-defined]
        if divisor is not None and (not wanted or _names(divisor) & wanted):
            return True
        if depth < 3 and isinstance(node, (ast.Name, ast.Attribute)) and dotted(node):
            key = dotted(node)
            if _divided_in_place(facts, key or "", wanted):
                return True
            for v in facts.values(node):
                if (
                    isinstance(v, ast.expr)
                    and v is not node
                    and _divided(facts, v, wanted, depth + 1)
                ):
                    return True
    return False


def _is_division(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)


def _divided_in_place(facts: ModuleFacts, key: str, wanted: set[str]) -> bool:
    """``loss /= N`` (or ``loss.div_(N)``) somewhere in the module."""
    for node in facts.nodes:
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.op, (ast.Div, ast.FloorDiv))
            and dotted(node.target) == key
            and (not wanted or _names(node.value) & wanted)
        ):
            return True
    return False


def _loss_of(call: ast.Call) -> ast.AST:
    """What ``call`` (a ``.backward()``) differentiates: ``loss`` of ``loss.backward()`` and of
    ``scaler.scale(loss).backward()``."""
    if call.args:  # `accelerator.backward(loss)`, `run.backward(loss)`
        return call.args[0]
    owner = call.func.value if isinstance(call.func, ast.Attribute) else call
    if isinstance(owner, ast.Call) and method(owner) == "scale" and owner.args:
        return owner.args[0]
    return owner


def _is_optimizer_step(call: ast.Call) -> bool:
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "step"):
        return False
    owner = last_name(call.func.value).lower()
    return "optim" in owner or owner in ("opt", "scaler")


@dataclass(frozen=True, slots=True)
class Accumulation:
    """A loop that steps the optimizer every ``count`` passes of its body."""

    loop: ast.AST
    count: ast.expr
    calls: list[tuple[ast.Call, bool]]
    """Every call of the body (not of nested loops or functions) and whether it runs on every
    pass (no ``if``/``try`` around it inside the loop)."""


def _accumulations(facts: ModuleFacts) -> list[Accumulation]:
    """The loops with ``if (i + 1) % N == 0: optimizer.step()`` (a loop counter on the left),
    and the functions run once per micro-batch with such a test on a parameter
    (``def train_step(self, it, batch): ... if (it + 1) % self.accum == 0: ...``). Found once
    per module (three rules share them)."""
    cached = facts.memo.get("accumulations")
    if cached is None:
        cached = facts.memo["accumulations"] = list(_find_accumulations(facts))
    return cached  # type: ignore[return-value]


def _find_accumulations(facts: ModuleFacts) -> Iterator[Accumulation]:
    done: set[int] = set()
    for step, _ in facts.calls():
        if not (_is_optimizer_step(step) or _in_helper(facts, step, _is_optimizer_step)):
            continue  # (`if micro % accum == 0: self._optimizer_step()` steps in a helper)
        tests: list[ast.expr] = []
        window: ast.AST | None = None
        for _, parent in facts.ancestors(step):
            if isinstance(parent, ast.If):
                tests.append(parent.test)
            if isinstance(parent, (*LOOPS, ast.FunctionDef, ast.AsyncFunctionDef)):
                window = parent
                break
            if isinstance(parent, (ast.Lambda, ast.ClassDef)):
                break
        if window is None or id(window) in done:
            continue
        loop = window
        if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
            counters = _counters(loop)
        elif isinstance(loop, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = loop.args
            counters = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
            counters |= _counters_of(loop) | _self_counters(facts)
            counters -= {"self", "cls"}
        else:
            continue
        tests += _skips_before(facts, step, loop)
        count = next(
            (c for t in tests if (c := _accumulation_count(t, counters, facts)) is not None), None
        )
        if count is None:
            continue
        done.add(id(loop))
        calls: list[tuple[ast.Call, bool]] = []
        skipped = _after_skip(loop)
        for node in ast.walk(loop):
            if isinstance(node, ast.Call):
                path = _between(facts, node, loop)
                if path is not None:
                    # a `try` body and its `finally` run every pass; an `except` does not
                    guarded = any(
                        isinstance(p, (ast.If, ast.IfExp, ast.ExceptHandler)) for p in path
                    )
                    calls.append((node, not guarded and not (path and path[-1] in skipped)))
        if any(always and _is_optimizer_step(c) for c, always in calls) or not any(
            c is step for c, always in calls if not always
        ):
            continue  # another optimizer steps every batch (a GAN's critic): not accumulation
        yield Accumulation(loop, count, calls)


@rule("PT019", "accumulation-not-divided", "gradient accumulation without dividing the loss")
def accumulation_not_divided(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``loss.backward()`` every batch, ``optimizer.step()`` every N: the loss never divided.

    Gradients add up over the N micro-batches, so each step is N times larger than the one the
    learning rate was tuned for (a sum instead of a mean); changing N changes the training.
    """
    facts = module_facts(tree)
    yield from _micro_batch_findings(facts)
    for acc in _accumulations(facts):
        count = acc.count
        wanted = _names(count) - {""}
        for call, always in acc.calls:
            if not always or method(call) != "backward":
                continue
            inline = any(_is_division(n) for n in ast.walk(_loss_of(call)))  # `(l / k).backward()`
            if inline or _divided(facts, _loss_of(call), wanted):
                continue
            yield Finding.at(
                "PT019",
                call,
                message="backward() runs every batch and the optimizer steps every "
                f"{ast.unparse(count)}: the gradients are summed over the micro-batches, not "
                "averaged, so each step is that many times too large",
                fix=f"divide the loss by the number of micro-batches: (loss / "
                f"{ast.unparse(count)}).backward()",
                api="with run.accumulate(model): run.backward(loss)",
            )


def _micro_batch_loops(facts: ModuleFacts) -> Iterator[tuple[ast.For, ast.Call]]:
    """``for i in range(0, n, micro):`` over slices ``x[i : i + micro]`` with a backward() on
    every pass and no optimizer step inside: one step's gradients summed over micro-batches.
    Yields (loop, backward call)."""
    for loop in facts.nodes:
        if not (
            isinstance(loop, ast.For)
            and isinstance(loop.target, ast.Name)
            and isinstance(loop.iter, ast.Call)
            and last_name(loop.iter.func) == "range"
            and len(loop.iter.args) == 3
        ):
            continue
        var, stride = loop.target.id, ast.unparse(loop.iter.args[2])
        inside = [n for stmt in loop.body for n in ast.walk(stmt)]
        sliced = any(
            isinstance(n, ast.Slice)
            and isinstance(n.lower, ast.Name)
            and n.lower.id == var
            and n.upper is not None
            and stride in ast.unparse(n.upper)
            for n in inside
        )
        if not sliced or any(isinstance(n, ast.Call) and _is_optimizer_step(n) for n in inside):
            continue
        for n in inside:
            if isinstance(n, ast.Call) and method(n) == "backward" and _every_pass(facts, n, loop):
                yield loop, n


def _every_pass(facts: ModuleFacts, call: ast.Call, loop: ast.AST) -> bool:
    """``call`` runs on every pass of ``loop``: no loop or function between, and each ``if``
    around it has a backward() in its other branch too (``if fp16: scaled.backward() else:
    loss.backward()``)."""
    path = _between(facts, call, loop)
    if path is None:
        return False
    child: ast.AST = call
    for parent in path:
        if isinstance(parent, (ast.IfExp, *LOOPS, *SCOPES)):
            return False
        if isinstance(parent, ast.If):
            other = parent.orelse if child in parent.body else parent.body
            if not any(method(n) == "backward" for s in other for n in ast.walk(s)):
                return False
        child = parent
    return True


def _micro_batch_findings(facts: ModuleFacts) -> Iterator[Finding]:
    for loop, call in _micro_batch_loops(facts):
        loss = _loss_of(call)
        if any(_is_division(n) for n in ast.walk(loss)) or _divided(facts, loss, set()):
            continue
        stride = ast.unparse(loop.iter.args[2])  # type: ignore[attr-defined]
        yield Finding.at(
            "PT019",
            call,
            message=f"backward() runs for every micro-batch of {stride} and the optimizer "
            "steps once for the whole batch: each micro-batch's mean loss adds its full "
            "gradient, so the step is as many times too large as there are micro-batches",
            fix="weigh each micro-batch's loss by its share of the batch: "
            "(loss * micro.shape[0] / batch.shape[0]).backward()",
            api="with run.accumulate(model): run.backward(loss)",
        )


@rule("PT022", "zero-grad-every-micro-batch", "zero_grad() on every micro-batch of accumulation")
def zero_grad_every_micro_batch(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``optimizer.zero_grad()`` on every pass of a loop that steps every N batches.

    Each micro-batch wipes the gradients the ones before it left: the step sees the last
    micro-batch only, so training runs on 1/N of the data at N times the cost, with no error.
    """
    facts = module_facts(tree)
    for acc in _accumulations(facts):
        for call, always in acc.calls:
            if always and method(call) != "zero_grad":
                call = _in_helper(facts, call, lambda c: method(c) == "zero_grad") or call
            if always and method(call) == "zero_grad":
                yield Finding.at(
                    "PT022",
                    call,
                    message="zero_grad() runs on every micro-batch while the optimizer steps "
                    f"every {ast.unparse(acc.count)}: it wipes the gradients accumulated so far, "
                    "so each step sees only the last micro-batch",
                    fix="zero the gradients right after optimizer.step(), inside the same `if`",
                    api="with run.accumulate(model): run.backward(loss); run.step(optimizer) "
                    "(steps and zeroes every N micro-batches)",
                )


def _in_helper(
    facts: ModuleFacts, call: ast.Call, wanted: Callable[[ast.Call], bool]
) -> ast.Call | None:
    """The first call ``wanted`` that the function ``call`` runs makes on every run (no
    ``if`` around it), or None."""
    found = facts.function_of(call)
    if found is None or found[0] is not facts:
        return None
    func = found[1]
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and wanted(node):
            path = _between(facts, node, func)
            if path is not None and not any(isinstance(p, (ast.If, ast.Try)) for p in path):
                return node
    return None


def _is_scheduler_step(call: ast.Call) -> bool:
    if method(call) != "step":
        return False
    owner = last_name(call.func.value).lower()  # type: ignore[attr-defined]
    return "sched" in owner or owner in ("lr", "lr_policy", "warmup")


@rule("PT027", "scheduler-every-micro-batch", "scheduler.step() on every micro-batch")
def scheduler_every_micro_batch(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``scheduler.step()`` on every pass of a loop whose optimizer steps every N batches.

    The schedule advances N times per optimizer step: warm-up ends N times too early and the
    decay reaches its end after 1/N of the training (torch warns that the scheduler stepped
    before the optimizer).
    """
    facts = module_facts(tree)
    for acc in _accumulations(facts):
        for call, always in acc.calls:
            if always and _is_scheduler_step(call):
                yield Finding.at(
                    "PT027",
                    call,
                    message="the learning-rate scheduler steps on every micro-batch while the "
                    f"optimizer steps every {ast.unparse(acc.count)}: the schedule runs that "
                    "many times too fast",
                    fix="call scheduler.step() right after optimizer.step(), inside the same `if`",
                    api="run.step(optimizer, scheduler) (steps both once per N micro-batches)",
                )
