"""Rules about what the ranks exchange and when they must wait for each other.

PT024 a SUM all-reduce of per-rank means reported as a mean; PT025 early stopping decided on one
rank's own metric (the others hang); PT026 rank 0 saves and every rank loads with no barrier in
between; PT028 a CPU tensor given to a collective under NCCL.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from paratrain.commands.check.findings import Finding, rule
from paratrain.commands.check.guards import guards_of
from paratrain.commands.check.patterns import (
    FUNCTIONS,
    ModuleFacts,
    dotted,
    keyword,
    last_name,
    method,
    module_facts,
    own_nodes,
)

TENSOR_COLLECTIVES = {
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter",
}  # fmt: skip
MEAN_WORDS = ("loss", "acc", "avg", "mean", "top1", "top5", "ppl", "perplexity", "score", "f1")
SUM_WORDS = ("sum", "total", "count", "correct", "num", "n_", "samples", "size", "tokens")
REPORTS = {"print", "log", "info", "add_scalar", "add_scalars", "write", "set_postfix", "update"}
FACTORIES = {
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange", "randn",
    "rand", "FloatTensor", "LongTensor", "Tensor",
}  # fmt: skip


def _collective(facts: ModuleFacts, call: ast.Call) -> str | None:
    qual = facts.qualname(call.func)
    name = qual.rsplit(".", 1)[-1]
    if qual.startswith("torch.distributed.") and name in TENSOR_COLLECTIVES:
        return name
    return None


# -- PT024 ------------------------------------------------------------------------------------
def _words(node: ast.AST) -> str:
    return " ".join(last_name(n).lower() for n in ast.walk(node) if last_name(n))


LOSS_FUNCTIONS = ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
                  "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
                  "kl_div", "criterion", "loss_fn", "loss_func")  # fmt: skip


def _mean_loss(facts: ModuleFacts, call: ast.Call) -> bool:
    """A loss function's value: the mean over the batch unless ``reduction=`` says otherwise
    (``F.cross_entropy(out, y)``, ``criterion(out, y)``)."""
    name = last_name(call.func)
    if name not in LOSS_FUNCTIONS and not name.endswith("_loss"):
        return False
    reduction = keyword(call, "reduction")
    return not (isinstance(reduction, ast.Constant) and reduction.value in ("sum", "none"))


def _is_mean(facts: ModuleFacts, node: ast.expr, seen: frozenset[int] = frozenset()) -> bool:
    """A per-rank mean: ``x.mean()``, a division, ``torch.tensor(acc)`` of one; a value whose
    computation is not in this module (a parameter, a meter's ``.avg``) by its name (``loss``).
    ``seen``: the values followed so far (``values = torch.stack(values)`` refers to itself)."""
    origins = facts.values(node)
    key = dotted(node)
    computed = any(isinstance(v, ast.expr) and dotted(v) != key for v in origins)
    for value in [node, *origins]:
        if not isinstance(value, ast.expr) or id(value) in seen:
            continue
        seen = seen | {id(value)}
        if isinstance(value, ast.Call) and method(value) == "mean":
            return True
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div):
            return True
        if isinstance(value, ast.Call) and _mean_loss(facts, value):
            return True
        made = (
            isinstance(value, ast.Call)
            and last_name(value.func) in ("tensor", "as_tensor", "stack")
            and bool(value.args)
        )
        first = value.args[0] if made else None  # type: ignore[attr-defined]
        parts = first.elts if isinstance(first, (ast.List, ast.Tuple)) else [first]
        if made and parts and all(p is not None and _is_mean(facts, p, seen) for p in parts):
            return True  # `torch.tensor(acc)`, `torch.tensor([self.avg])`
        if value is node and computed:
            continue  # how it is computed is known: judged by that, not by its name
        text = _words(value) if dotted(value) or isinstance(value, ast.Call) else ""
        if any(w in text for w in MEAN_WORDS) and not any(w in text for w in SUM_WORDS):
            stacked = isinstance(value, ast.Call) and last_name(value.func) in ("stack", "cat")
            return dotted(value) is not None or stacked or method(value) in (
                "detach", "clone", "item",
            )  # fmt: skip
    return False


def _summed(facts: ModuleFacts, call: ast.Call) -> bool:
    op = keyword(call, "op") or (call.args[1] if len(call.args) > 1 else None)
    return op is None or last_name(op) == "SUM"


def _divided_after(facts: ModuleFacts, key: str, call: ast.Call) -> bool:
    """``t /= world_size``, ``t.div_(n)``, ``t = t / n`` or ``t / n`` read after the reduce."""
    line = call.lineno
    for node in own_nodes(facts.scope_of(call)):
        if getattr(node, "lineno", 0) < line:
            continue
        scaled = (ast.Div, ast.FloorDiv, ast.Mult)
        if isinstance(node, ast.AugAssign) and isinstance(node.op, scaled):
            if dotted(node.target) == key:
                return True
        elif isinstance(node, ast.BinOp) and isinstance(node.op, scaled):
            if any(dotted(n) == key for n in ast.walk(node.left)):
                return True
        elif method(node) in ("div_", "div", "mul_", "true_divide") and (
            dotted(node.func.value) == key  # type: ignore[attr-defined]
        ):
            return True
    return False


def _reported_after(facts: ModuleFacts, key: str, call: ast.Call) -> ast.AST | None:
    """A print or log of ``key`` after the reduce (or of a name set from it there:
    ``metrics = {"loss": t[0].item()}``), or a ``return`` of it (the caller reports)."""
    line = call.lineno
    keys = {key}
    for node in own_nodes(facts.scope_of(call)):
        later = isinstance(node, ast.Assign) and node.lineno > line
        if later and any(dotted(n) == key for n in ast.walk(node.value)):  # type: ignore[attr-defined]
            keys |= {k for t in node.targets if (k := dotted(t)) is not None}  # type: ignore[attr-defined]
            for target in node.targets:  # type: ignore[attr-defined]
                if any(w in last_name(target).lower() for w in ("avg", "mean")):
                    return node  # stored back as the average: `self.avg = t.item()`
    for name in sorted(keys):
        found = _reported_as(facts, name, call)
        if found is not None:
            return found
    return None


def _reported_as(facts: ModuleFacts, key: str, call: ast.Call) -> ast.AST | None:
    line = call.lineno
    for node in own_nodes(facts.scope_of(call)):
        if isinstance(node, ast.Return) and node.value is not None and node.lineno > line:
            returned = node.value
            if any(dotted(n) == key for n in ast.walk(returned)):
                return node
        if not isinstance(node, ast.Call) or getattr(node, "lineno", 0) <= line:
            continue
        name = facts.qualname(node.func) if isinstance(node.func, ast.Name) else method(node)
        if name not in REPORTS:
            continue
        args = [*node.args, *(k.value for k in node.keywords)]
        if any(dotted(n) == key for a in args for n in ast.walk(a)):
            return node
    return None


@rule("PT024", "sum-reported-as-mean", "a SUM all-reduce of per-rank means reported as a mean")
def sum_reported_as_mean(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``dist.all_reduce(loss)`` (a SUM) of each rank's mean loss, then printed as the loss.

    The reduced value is world-size times the mean: the logged loss or accuracy grows with the
    number of GPUs (an "accuracy" of 3.2 on 4 ranks).
    """
    facts = module_facts(tree)
    for call, _ in facts.calls():
        if _collective(facts, call) != "all_reduce" or not call.args or not _summed(facts, call):
            continue
        key = dotted(call.args[0])
        if key is None or not _is_mean(facts, call.args[0]) or _divided_after(facts, key, call):
            continue
        if _reported_after(facts, key, call) is None:
            continue
        yield Finding.at(
            "PT024",
            call,
            message=f"`{key}` is each rank's mean, and all_reduce sums it: what is reported is "
            "world-size times the mean",
            fix=f"divide after the reduce ({key} /= dist.get_world_size()), or reduce with "
            "op=dist.ReduceOp.AVG (nccl), or reduce sums and counts and divide",
            api=f'run.reduce({key}, "mean")',
        )


# -- PT025 ------------------------------------------------------------------------------------
STOP_WORDS = (
    "loss", "acc", "metric", "score", "patience", "bad_epoch", "no_improve", "stop", "wait",
    "best", "plateau", "improve", "val", "f1", "bleu", "ppl", "perplexity", "counter",
)  # fmt: skip
NOT_METRICS = ("step", "epoch", "iter", "max_", "args", "config", "cfg")


def _metric_words(key: str) -> bool:
    """The name speaks of a measured value (``val_loss``, ``bad_epochs``, ``best_acc``,
    ``epochs_without_improvement``); ``eval_only`` and ``accum`` do not (``val`` and ``acc``
    must be words of their own)."""
    name = key.rsplit(".", 1)[-1].lower()
    words = name.split("_")
    return any(w in name if "_" in w else any(
        t == w or (len(w) > 3 and t.startswith(w)) for t in words
    ) for w in STOP_WORDS)  # fmt: skip


def _is_setting(key: str) -> bool:
    """A configuration value: ``args.patience``, ``cfg.max_epochs``, ``PATIENCE``."""
    head = key.split(".", 1)[0].lower()
    return head in ("args", "cfg", "config", "opt", "hparams", "flags") or key.isupper()


def _is_metric(key: str) -> bool:
    return _metric_words(key) and not _is_setting(key)


def _is_counter(key: str) -> bool:
    """A step or epoch counter (``iter_num``, ``global_step``, ``max_iters``), not a count of
    epochs without improvement."""
    return not _metric_words(key) and any(w in key.lower() for w in NOT_METRICS)


def _varies(facts: ModuleFacts, key: str, loop: ast.AST) -> bool:
    """``key`` is a measured value, or something (not a counter) set inside ``loop``."""
    if _is_metric(key):
        return True
    if _is_counter(key) or _is_setting(key):
        return False
    return any(
        any(parent is loop for _, parent in facts.ancestors(site))
        for site in facts.sites.get(key, [])
    )


def _read_names(node: ast.AST) -> set[str]:
    """The whole dotted names ``node`` reads (``self.stopper``, not ``self``), called ones
    without their method (``self.stopper`` for ``self.stopper.step(x)``)."""
    found: set[str] = set()
    inner: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            inner.add(id(n.value))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            inner.add(id(n.func))
            found.discard(dotted(n.func) or "")
    for n in ast.walk(node):
        if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in inner:
            key = dotted(n)
            if key is not None and key not in ("self", "cls"):
                found.add(key)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            owner = dotted(n.func.value)
            if owner is not None and owner not in ("self", "cls"):
                found.add(owner)
    return found


def _influences(facts: ModuleFacts, test: ast.AST) -> set[str]:
    """The names ``test`` depends on: the names it reads, what they were set from (through
    helpers' returns) and the ``if`` tests their assignments sit under (``bad_epochs += 1``
    under ``if val_loss >= best``)."""
    seen: set[str] = set()
    frontier = list(_read_names(test))
    while frontier and len(seen) < 200:
        key = frontier.pop()
        if key in seen:
            continue
        seen.add(key)
        more: set[str] = set()
        for value in facts.values_of(key) if key.isidentifier() or "." in key else []:
            if isinstance(value, ast.expr):
                more |= _read_names(value)
        for site in facts.sites.get(key, []):
            if isinstance(site, ast.AugAssign):
                more |= _read_names(site.value)
            for _, parent in facts.ancestors(site):
                if isinstance(parent, (ast.If, ast.While)):
                    more |= _read_names(parent.test)
                if isinstance(parent, (*FUNCTIONS, ast.ClassDef)):
                    break
        frontier += sorted(more - seen)
    return seen


def _shared(facts: ModuleFacts) -> set[str]:
    """Names every rank holds the same value of: a collective's tensors (in place), and what a
    reducing helper returns (``reduce_tensor(x)``, ``run.reduce(x)``)."""
    found: set[str] = set()
    for call, qual in facts.calls():
        name = last_name(call.func).lower()
        exchanging = qual.startswith("torch.distributed.") and (
            "reduce" in name or "gather" in name or "broadcast" in name or "scatter" in name
        )
        if exchanging and call.args:  # the tensor (or list of them) it fills in place
            first = call.args[0]
            parts = first.elts if isinstance(first, (ast.List, ast.Tuple)) else [first]
            found |= {k for p in parts if (k := dotted(p)) is not None}
        elif any(w in name for w in ("reduce", "gather", "broadcast", "sync", "all_")):
            parent = facts.parents.get(call)
            if isinstance(parent, ast.Assign):
                for target in parent.targets:
                    found |= _read_names(target)
    return found


def _trains(facts: ModuleFacts, scope: ast.AST) -> bool:
    """``scope`` calls backward, or a function of this module that does (two deep)."""
    return any(method(c) == "backward" for _, c in facts.calls_within(scope))


@rule("PT025", "early-stop-one-rank", "early stopping decided on one rank's own metric")
def early_stop_one_rank(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``if val_loss > best: ...; break`` where each rank computed ``val_loss`` on its shard.

    The ranks see different numbers, so one stops while the others go on into the next
    collective (a gradient all-reduce) and wait for it forever (the NCCL timeout).
    """
    facts = module_facts(tree)
    if not facts.distributed:
        return
    shared = _shared(facts)
    for node in facts.nodes:
        if not isinstance(node, (ast.Break, ast.Return)):
            continue
        test, loop = _stop_test(facts, node)
        if (
            test is None
            or loop is None
            or not _trains(facts, loop)
            or guards_of(facts).main_only(node)
        ):
            continue
        if not any(_varies(facts, k, loop) for k in _read_names(test)):
            continue  # `if iter_num > max_iters: break`, `if eval_only: break`: alike everywhere
        depends = _influences(facts, test)
        if not any(_is_metric(k) for k in depends) or depends & shared:
            continue
        yield Finding.at(
            "PT025",
            node,
            message="training stops on this rank's own metric: the ranks computed it on "
            "different shards, so one stops while the others wait in the next collective "
            "(a hang until the timeout)",
            fix="decide on numbers every rank shares: all_reduce the metric first, or "
            "broadcast rank 0's decision (dist.broadcast(stop_flag, src=0)) and break together",
            api='run.reduce(val_loss, "mean") before the test',
        )


def _stop_test(facts: ModuleFacts, stop: ast.AST) -> tuple[ast.expr | None, ast.AST | None]:
    """The ``if`` test that leads to ``stop`` and the loop ``stop`` leaves (a ``return`` leaves
    every loop of its function: the outermost)."""
    test: ast.expr | None = None
    loop: ast.AST | None = None
    for _, parent in facts.ancestors(stop):
        if isinstance(parent, ast.If) and test is None:
            test = parent.test
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)):
            loop = parent
            if isinstance(stop, ast.Break):
                break
        if isinstance(parent, (*FUNCTIONS, ast.Lambda, ast.ClassDef)):
            break
    return test, loop


# -- PT026 ------------------------------------------------------------------------------------
def _does(facts: ModuleFacts, call: ast.Call, what: str, depth: int = 0) -> bool:
    """``call`` is ``torch.<what>`` or runs a function of this module that calls it."""
    return bool(_inner(facts, call, what, depth))


def _inner(facts: ModuleFacts, call: ast.Call, what: str, depth: int = 0) -> list[ast.Call]:
    """The ``torch.<what>`` calls ``call`` makes: itself, or those of the functions it runs."""
    if facts.qualname(call.func) == f"torch.{what}":
        return [call]
    found = facts.function_of(call) if depth < 2 else None
    if found is None:
        return []
    owner, func = found
    key = ("inner", id(func), what, depth)
    cached = owner.memo.get(key)
    if cached is None:
        cached = owner.memo[key] = [
            inner
            for n in ast.walk(func)
            if isinstance(n, ast.Call)
            for inner in _inner(owner, n, what, depth + 1)
        ]
    return cached  # type: ignore[return-value]


def _saves_on_main(facts: ModuleFacts, call: ast.Call) -> bool:
    """``call`` saves, on the main process only: guarded where it is called, or every save it
    makes is guarded inside the function it runs."""
    guards = guards_of(facts)
    if facts.qualname(call.func) == "torch.save":
        return guards.main_only(call)
    saves = [s for s in _inner(facts, call, "save") if s is not call]
    if not saves:  # a load (or anything else) under a rank-0 guard saves nothing
        return False
    return guards.main_only(call) or all(guards.main_only(s, within=True) for s in saves)


PATH_WORDS = ("path", "file", "ckpt", "checkpoint", "dir", "best", "cache", "out", "weights",
              "pretrained", "snapshot", "fname", "filename", "name")  # fmt: skip


def _paths(facts: ModuleFacts, call: ast.Call) -> set[str]:
    """The texts of what may name a file among ``call``'s arguments: strings, f-strings,
    ``os.path.join(...)`` and names that read like paths (``path``, ``args.ckpt``)."""
    found: set[str] = set()
    for what in ("save", "load"):  # the paths the functions it runs write or read
        for inner in _inner(facts, call, what):
            if inner is not call:
                found |= _paths(facts, inner)
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        if isinstance(arg, (ast.Constant, ast.JoinedStr)) or (
            isinstance(arg, ast.Call) and (last_name(arg.func) in ("join", "Path"))
        ):
            found.add(ast.unparse(arg))
        elif dotted(arg) and any(w in last_name(arg).lower() for w in PATH_WORDS):
            found.add(ast.unparse(arg))
            found |= {ast.unparse(v) for v in facts.values(arg) if isinstance(v, ast.expr)}
    return found


def _waits(facts: ModuleFacts, call: ast.Call) -> bool:
    """``call`` is a barrier, or runs a function that waits at one (two deep)."""
    return any(
        last_name(c.func) in ("barrier", "monitored_barrier", "wait_for_everyone")
        for _, c in facts.calls_within(call)
    )


@rule("PT026", "load-before-save-done", "every rank loads what rank 0 saves, with no barrier")
def load_before_save_done(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``if rank == 0: torch.save(sd, p)`` and then ``torch.load(p)`` on every rank.

    Nothing makes the other ranks wait for rank 0's write: they read a missing file, an old one
    or a half-written one (an unpickling error, or stale weights without an error).
    """
    facts = module_facts(tree)
    scopes: dict[ast.AST, list[ast.Call]] = {}
    for call, _ in facts.calls():
        scopes.setdefault(facts.scope_of(call), []).append(call)
    for calls in scopes.values():
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
        saved: set[str] = set()
        for call in calls:
            if _saves_on_main(facts, call):
                saved |= _paths(facts, call)
            elif saved and _waits(facts, call):
                saved = set()
            elif (
                saved
                and _does(facts, call, "load")
                and saved & _paths(facts, call)
                and not guards_of(facts).main_only(call)
            ):
                yield Finding.at(
                    "PT026",
                    call,
                    message="every rank loads here what rank 0 saved just before, and nothing "
                    "waits for the write: the others read a missing, old or half-written file",
                    fix="call dist.barrier() after the save and before the load",
                    api="run.save() and run.resume() (rank 0 writes, every rank waits for it)",
                )
                saved = set()


# -- PT028 ------------------------------------------------------------------------------------
def _nccl_only(facts: ModuleFacts) -> bool:
    """The script's process group is NCCL, whatever the machine."""
    for call, qual in facts.calls():
        if not qual.endswith("init_process_group"):
            continue
        backend = keyword(call, "backend") or (call.args[0] if call.args else None)
        if backend is None:
            continue
        values = [backend, *facts.values(backend)] if dotted(backend) else [backend]
        constants = [v for v in values if isinstance(v, ast.Constant)]
        others = [v for v in values if not isinstance(v, ast.Constant) and v is not backend]
        if constants and not others and all(v.value == "nccl" for v in constants):
            return True
    return False


def _on_cpu(facts: ModuleFacts, node: ast.expr) -> bool:
    """Every value of ``node`` is a tensor made on the CPU: a factory without ``device=``, or
    ``.cpu()``."""
    values = facts.values(node)
    if not values:
        return False
    for v in values:
        if not isinstance(v, ast.Call):
            return False
        if method(v) == "cpu":
            continue
        qual = facts.qualname(v.func)
        if not (qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in FACTORIES):
            return False
        if keyword(v, "device") is not None:
            return False
    return True


@rule("PT028", "cpu-tensor-nccl", "a CPU tensor given to a collective under NCCL")
def cpu_tensor_nccl(tree: ast.Module, lines: Sequence[str]) -> Iterator[Finding]:
    """``t = torch.tensor([correct, total]); dist.all_reduce(t)`` with the NCCL backend.

    NCCL moves GPU memory only: the call fails ("No backend type associated with device type
    cpu", or "Tensors must be CUDA and dense").
    """
    facts = module_facts(tree)
    if not _nccl_only(facts) or any(
        last_name(c.func) in ("set_default_device", "set_default_tensor_type")
        for c, _ in facts.calls()
    ):
        return  # tensors are made on the GPU by default
    for call, _ in facts.calls():
        name = _collective(facts, call)
        if name is None or not call.args:
            continue
        tensor = call.args[1] if name == "all_gather" and len(call.args) > 1 else call.args[0]
        if _on_cpu(facts, tensor):
            yield Finding.at(
                "PT028",
                call,
                message=f"dist.{name} gets a CPU tensor and the backend is nccl, which takes "
                "CUDA tensors only: the call fails at run time",
                fix="make the tensor on this rank's GPU: torch.tensor(..., device=device) "
                "(or .cuda() / .to(device) before the collective)",
                api='run.reduce(value, "sum") (moves it to the right device)',
            )
