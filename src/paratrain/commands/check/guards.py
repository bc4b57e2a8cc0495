"""Which process runs a statement: rank values, rank tests and the guards made of them.

    guards = guards_of(module_facts(tree))
    guards.rank_test(test)   # MAIN, OFF, SINGLE, MULTI, ONE or None for an `if` test
    guards.main_only(node)   # True: only the main process (or a lone process) runs `node`
    guards.is_global_rank(x) # dist.get_rank(), $RANK, node_rank * ngpus + gpu, a helper's return

A test is read whatever its spelling: ``rank == 0``, ``local_rank in [-1, 0]``,
``args.local_rank == -1 or dist.get_rank() == 0``, ``not dist.is_initialized() or
dist.get_rank() == 0``, ``(rank := dist.get_rank()) == 0``, ``match dist.get_rank(): case 0:``,
a variable set from such a test (``is_primary = dist.get_rank() == 0``), a helper whose
returns are such tests (``def is_master(): return get_rank() == 0``), and the names
libraries give the main process (``is_main_process``, ``is_global_zero``,
``is_data_parallel_master``). A statement is main-only under such a guard, in the ``else`` of
``if dist.is_initialized():``, under a test for one other rank (``rank == world_size - 1``),
after an early exit of the others (``if rank != 0: return``), in a function decorated
``@rank_zero_only`` or with a decorator of the file whose wrapper calls it under a guard, or in
a function every caller calls under a guard.
"""

from __future__ import annotations

import ast

from paratrain.commands.check.patterns import Function, ModuleFacts
from paratrain.commands.check.syntax import dotted, env_key, last_name

MAIN, OFF, SINGLE, MULTI, ONE = "main", "off", "single", "multi", "one"
"""Where a test holds: only on rank 0; only off it; only without several processes; only with;
on one rank other than 0 (``rank == world_size - 1``)."""
ALONE = (MAIN, SINGLE, ONE)
"""Kinds under which a single process runs the code."""
MAIN_NAMES = {
    "is_main", "is_main_process", "main_process", "is_master", "master_process", "master",
    "is_master_process", "is_rank_zero", "is_rank0", "rank_zero", "rank0", "is_global_zero",
    "is_local_main_process", "is_world_process_zero", "is_local_process_zero", "is_primary",
    "is_main_rank", "is_leader", "is_chief", "main_rank", "is_root", "is_logging_process",
}  # fmt: skip
DISTRIBUTED_NAMES = {
    "distributed", "is_distributed", "ddp", "use_ddp", "multi_gpu", "multiprocessing_distributed",
    "is_initialized", "is_dist_avail_and_initialized", "dist_initialized", "use_distributed",
}  # fmt: skip
RANK_ZERO_DECORATORS = {
    "rank_zero_only", "main_process_only", "on_main_process", "master_only", "main_process",
    "rank0_only", "on_rank_zero",
}  # fmt: skip
RANK_CALLS = {"get_rank", "get_local_rank", "get_global_rank", "get_node_rank"}
RANK_ENV = {"RANK", "LOCAL_RANK"}
EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_NEGATE: dict[str | None, str | None] = {MAIN: OFF, OFF: MAIN, SINGLE: MULTI, MULTI: SINGLE}


def guards_of(facts: ModuleFacts) -> Guards:
    """The rank facts of ``facts``' module, made once and shared by the rules."""
    found = facts.memo.get("guards")
    if not isinstance(found, Guards):
        found = facts.memo["guards"] = Guards(facts)
    return found


class Guards:
    """Rank facts of one module (see the module docstring)."""

    def __init__(self, facts: ModuleFacts) -> None:
        self.facts = facts
        self._function_main: dict[int, bool] = {}
        self._testing: set[int] = set()
        self._tested: dict[int, str | None] = {}
        self._helper: dict[tuple[int, str], bool] = {}

    # -- rank values ---------------------------------------------------------------------
    def _unwrapped(self, node: ast.AST) -> ast.AST:
        while True:
            if isinstance(node, ast.NamedExpr):
                node = node.value
            elif (
                isinstance(node, ast.Call)
                and self.facts.qualname(node.func) in ("int", "str")
                and node.args
            ):
                node = node.args[0]
            else:
                return node

    def _returns_all(self, call: ast.Call, test: str) -> bool:
        """``call`` runs a function of this module (or a sibling) whose every non-constant
        return value is a ``test`` (``"global"``, ``"rank"`` or ``"main"``)."""
        found = self.facts.function_of(call)
        if found is None:
            return False
        owner, func = found
        key = (id(func), test)
        if key in self._helper:
            return self._helper[key]
        self._helper[key] = False  # recursion: not (yet) known
        guards = guards_of(owner)
        values = [r for r in owner.returns(func) if not isinstance(r, ast.Constant)]
        if test == "global":
            ok = bool(values) and all(r is not None and guards.is_global_rank(r) for r in values)
        elif test == "rank":
            ok = bool(values) and all(r is not None and guards.is_rank_like(r) for r in values)
        else:
            constant = [r for r in owner.returns(func) if isinstance(r, ast.Constant)]
            ok = (
                bool(values)
                and all(r is not None and guards.rank_test(r) in (MAIN, SINGLE) for r in values)
                and any(guards.rank_test(r) == MAIN for r in values if r is not None)
                and all(r.value in (True, 1) for r in constant)
            )
        self._helper[key] = ok
        return ok

    def _reads_global_rank(self, node: ast.AST) -> bool:
        node = self._unwrapped(node)
        facts = self.facts
        if isinstance(node, ast.Call):
            if facts.qualname(node.func) == "torch.distributed.get_rank" and not node.args:
                return keyword_missing(node, "group")
            return _env(facts, node) == "RANK" or self._returns_all(node, "global")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            # `node_rank * gpus_per_node + local_rank` (the ImageNet example's args.rank)
            return any(
                isinstance(side, ast.BinOp)
                and isinstance(side.op, ast.Mult)
                and any(self.is_rank_like(n) for n in (side.left, side.right))
                for side in (node.left, node.right)
            )
        return _env(facts, node) == "RANK"

    def is_global_rank(self, node: ast.AST) -> bool:
        """``node`` is this process's global rank: wrong as a device index on several nodes."""
        if self._reads_global_rank(node):
            return True
        if dotted(node) is None:
            return False
        values = [v for v in self.facts.values(node) if not isinstance(v, ast.Constant)]
        return bool(values) and all(  # `return 0, 1` without a process group: not a rank read
            isinstance(v, ast.expr) and v is not node and self._reads_global_rank(v) for v in values
        )

    def is_rank_like(self, node: ast.AST) -> bool:
        """A rank of some kind: a ``*rank*`` name, ``args.gpu``, ``get_rank()``, ``$RANK``."""
        if isinstance(node, ast.NamedExpr) and self.is_rank_like(node.target):
            return True
        node = self._unwrapped(node)
        if isinstance(node, ast.Call):
            name = last_name(node.func)
            return (
                name in RANK_CALLS
                or _env(self.facts, node) in RANK_ENV
                or self._returns_all(node, "rank")
            )
        name = last_name(node).lower()
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            name = str(node.slice.value).lower()  # args["rank"], env["LOCAL_RANK"]
        return (
            "rank" in name
            or name in ("gpu", "gpu_id", "process_index", "local_process_index")
            or _env(self.facts, node) in RANK_ENV
        )

    # -- tests ---------------------------------------------------------------------------
    def rank_test(self, test: ast.AST) -> str | None:
        """Where ``test`` holds: MAIN, OFF, SINGLE (no process group), MULTI, ONE, or None."""
        if id(test) in self._tested:
            return self._tested[id(test)]
        if id(test) in self._testing or len(self._testing) > 40:
            return None  # `a = b if c else a`: a test that depends on itself says nothing
        self._testing.add(id(test))
        try:
            kind = self._tested[id(test)] = self._rank_test(test)
        finally:
            self._testing.discard(id(test))
        return kind

    def _rank_test(self, test: ast.AST) -> str | None:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            if self._bare_rank(test.operand):
                return MAIN  # `if not rank:`
            return _NEGATE.get(self.rank_test(test.operand))
        if self._bare_rank(test):
            return OFF  # `if rank:` (any rank but 0)
        if isinstance(test, ast.IfExp):  # `get_rank() == 0 if is_initialized() else True`
            kinds = [SINGLE if is_true(b) else self.rank_test(b) for b in (test.body, test.orelse)]
            return MAIN if MAIN in kinds and all(k in (MAIN, SINGLE) for k in kinds) else None
        if isinstance(test, ast.BoolOp):
            return _combine(isinstance(test.op, ast.And), [self.rank_test(v) for v in test.values])
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            if isinstance(test.ops[0], (ast.IsNot, ast.Is)) and is_none(test.comparators[0]):
                kind = self._set_on_main_only(test.left)  # `if writer is not None:`
                return kind if isinstance(test.ops[0], ast.IsNot) else _NEGATE.get(kind)
            return self._comparison(test.left, test.ops[0], test.comparators[0])
        if isinstance(test, ast.NamedExpr):
            return self.rank_test(test.value)
        name = last_name(test.func if isinstance(test, ast.Call) else test).lstrip("_")
        if name in MAIN_NAMES or _main_name(name):
            return MAIN
        if name in DISTRIBUTED_NAMES:
            return MULTI
        if isinstance(test, ast.Call):
            return MAIN if self._returns_all(test, "main") else None
        key = dotted(test)
        if key is None:
            return None
        origins = self.facts.origins.get(key, [])
        if isinstance(test, ast.expr) and any(
            is_none(v) or isinstance(v, ast.IfExp) for v in origins
        ):
            kind = self._set_on_main_only(test)  # `if not writer: continue`, writer rank 0's
            if kind is not None:
                return kind
        if isinstance(test, ast.Attribute) and self._main_property(test.attr):
            return MAIN  # `env.leader` with `@property def leader(self): return self.rank == 0`
        values = self.facts.values(test)
        seen = {
            SINGLE if isinstance(v, ast.Constant) and v.value is True
            else self.rank_test(v) if isinstance(v, ast.expr) and v is not test
            else None
            for v in values
        }  # fmt: skip
        return MAIN if values and MAIN in seen and seen <= {MAIN, SINGLE} else None

    def _main_property(self, name: str) -> bool:
        """``name`` is a property of a class here whose returns are all rank-0 tests."""
        methods = [
            m for m in self.facts.functions.get(name, [])
            if any(last_name(d) in ("property", "cached_property") for d in m.decorator_list)
        ]  # fmt: skip
        if not methods:
            return False
        call = ast.Call(func=ast.Attribute(ast.Name("self"), name), args=[], keywords=[])
        return self._returns_all(call, "main")

    def _set_on_main_only(self, node: ast.expr) -> str | None:
        """MAIN when ``node`` is something other than None only on the main process:
        ``writer = SummaryWriter(...) if rank == 0 else None``, or ``writer = None`` and, under
        a rank-0 guard, ``writer = SummaryWriter(...)``."""
        key = dotted(node)
        if key is None:
            return None
        sites = self.facts.sites.get(key, [])
        values = self.facts.origins.get(key, [])
        real = [(v, s) for v, s in zip(values, sites, strict=True) if not is_none(v)]
        if not real:
            return None
        for value, site in real:
            if isinstance(value, ast.IfExp):
                kind = self.rank_test(value.test)
                if not ((kind in ALONE and is_none(value.orelse)) or (
                    _NEGATE.get(kind) in ALONE and is_none(value.body)
                )):  # fmt: skip
                    return None
            elif not self.main_only(site):
                return None
        return MAIN

    def _bare_rank(self, node: ast.AST) -> bool:
        """``rank`` / ``dist.get_rank()`` used as a truth value (not a flag named like one)."""
        if isinstance(node, ast.Call):
            return last_name(node.func) in RANK_CALLS
        return dotted(node) is not None and last_name(node).lower() in (
            "rank", "global_rank", "local_rank", "ddp_rank", "world_rank", "node_rank",
        )  # fmt: skip

    def _comparison(self, left: ast.expr, op: ast.cmpop, right: ast.expr) -> str | None:

        listed = isinstance(right, (ast.List, ast.Tuple, ast.Set))
        if isinstance(op, (ast.In, ast.NotIn)) and listed:
            # `local_rank in [-1, 0]`: the main process, or a run without distributed
            values = {_number(e) for e in right.elts}  # type: ignore[attr-defined]
            if not (self.is_rank_like(left) and values and values <= {0, -1}):
                return None
            kind = MAIN if 0 in values else SINGLE
            return kind if isinstance(op, ast.In) else _NEGATE[kind]
        if _number(left) is not None and _number(right) is None:
            left, right = right, left
            op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(
                type(op), op
            )
        value = _number(right)
        world = "world_size" in last_name(left).lower() or last_name(left) == "get_world_size"
        if world and value == 1:
            if isinstance(op, (ast.Eq, ast.LtE)):
                return SINGLE
            return MULTI if isinstance(op, (ast.Gt, ast.NotEq)) else None
        if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod) and value == 0:
            left = left.left  # `rank % gpus_per_node == 0`: the first process of each node
            if not (self.is_rank_like(left) and isinstance(op, ast.Eq)):
                return None
            return MAIN
        if not self.is_rank_like(left):
            return None
        if value is None or value > 0:  # `rank == world_size - 1`, `rank == 3`: one rank
            return ONE if isinstance(op, ast.Eq) and not self.is_rank_like(right) else None
        if value == -1:
            if isinstance(op, (ast.Eq, ast.Is)):
                return SINGLE
            return MULTI if isinstance(op, (ast.NotEq, ast.IsNot, ast.Gt, ast.GtE)) else None
        if value == 0:
            if isinstance(op, (ast.Eq, ast.Is, ast.LtE)):
                return MAIN
            return OFF if isinstance(op, (ast.NotEq, ast.Gt, ast.IsNot)) else None
        if value == 1 and isinstance(op, ast.Lt):
            return MAIN
        if value == 1 and isinstance(op, ast.GtE):
            return OFF
        return None

    def main_test(self, test: ast.AST) -> bool | None:
        """True: the test holds only on the main (or a lone) process; False: only off the
        main process; None: unknown or on every process."""
        kind = self.rank_test(test)
        if kind in ALONE:
            return True
        return False if kind == OFF else None

    # -- statements ----------------------------------------------------------------------
    def side(self, child: ast.AST, branch: ast.If) -> bool | None:
        """True: ``child`` (a statement of ``branch``) runs on the main process only; False:
        only off it; None: on both or unknown."""
        main = self.main_test(branch.test)
        if main is None or child is branch.test:
            return None
        return main if child in branch.body else not main

    def main_only(self, node: ast.AST, *, within: bool = False) -> bool:
        """``node`` runs on the main process only: under a rank-0 guard, after an early exit
        of the others, or in a function that is only ever called so (``within``: guards inside
        its own function only)."""
        facts = self.facts
        for child, parent in facts.ancestors(node):
            if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and child is not parent.test:
                kind = self.rank_test(parent.test)
                in_body = (
                    child in parent.body if isinstance(parent, ast.If) else child is parent.body
                ) if not isinstance(parent, ast.While) else True  # fmt: skip
                if (kind if in_body else _NEGATE.get(kind)) in ALONE:
                    return True  # the `else` of `if dist.is_initialized():` runs alone too
            elif isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And):
                values = parent.values
                before = values[: values.index(child)] if child in values else []
                if any(self.main_test(v) is True for v in before):
                    return True  # `is_main and print(...)`
            elif (
                isinstance(parent, ast.match_case)
                and child in parent.body
                and self._case_kind(parent) in (MAIN, SINGLE)
            ):
                return True
            if self._after_exit(child, parent):
                return True
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return not within and self.function_main_only(parent)
            if isinstance(parent, (ast.Lambda, ast.ClassDef)):
                return False
        return False

    def _after_exit(self, child: ast.AST, parent: ast.AST) -> bool:
        for block in ("body", "orelse", "finalbody"):
            siblings = getattr(parent, block, None)
            if isinstance(siblings, list) and child in siblings:
                earlier = siblings[: siblings.index(child)]
                return any(self._exits_off_main(s) for s in earlier)
        return False

    def _exits_off_main(self, stmt: ast.AST) -> bool:
        """``if rank != 0: return`` (or continue, break, raise): what follows is main only."""
        return (
            isinstance(stmt, ast.If)
            and not stmt.orelse
            and isinstance(stmt.body[-1], EXITS)
            and self.rank_test(stmt.test) == OFF
            and not self._narrowed(stmt.test)
        )

    def _narrowed(self, test: ast.AST) -> bool:
        """``test`` holds on only some of the other ranks: a conjunction with a condition that
        is not a rank test (``if not eval_all and rank != 0: return``: with ``eval_all`` every
        rank goes on). An exit under it leaves the other ranks in what follows."""
        return any(
            isinstance(node, ast.BoolOp)
            and isinstance(node.op, ast.And)
            and any(self.rank_test(v) != OFF for v in node.values)
            for node in ast.walk(test)
        )

    def _case_kind(self, case: ast.match_case) -> str | None:
        """MAIN for ``case 0:`` of ``match <rank>:``; OFF for a later ``case _:``."""
        match = self.facts.parents.get(case)
        if not (isinstance(match, ast.Match) and self.is_rank_like(match.subject)):
            return None
        pattern = case.pattern
        if isinstance(pattern, ast.MatchValue):
            value = _number(pattern.value)
            return MAIN if value == 0 else SINGLE if value == -1 else OFF
        if isinstance(pattern, ast.MatchOr):
            values = {_number(p.value) for p in pattern.patterns if isinstance(p, ast.MatchValue)}
            if len(values) == len(pattern.patterns) and values <= {0, -1} and 0 in values:
                return MAIN
            return None
        if isinstance(pattern, ast.MatchAs) and pattern.pattern is None and case.guard is None:
            earlier = match.cases[: match.cases.index(case)]
            if any(self._case_kind(c) == MAIN for c in earlier):
                return OFF
        return None

    def function_main_only(self, func: Function) -> bool:
        """Decorated ``@rank_zero_only``, or every reference to it in the module is a call made
        on the main process only (an uncalled function is not: it may be an entry point)."""
        key = id(func)
        if key in self._function_main:
            return self._function_main[key]
        if any(self._main_decorator(d) for d in func.decorator_list):
            self._function_main[key] = True
            return True
        self._function_main[key] = False  # recursion: not main-only
        refs = self.facts.references(func)
        result = bool(refs) and all(self.main_only(r) for r in refs)
        self._function_main[key] = result
        return result

    def _main_decorator(self, decorator: ast.expr) -> bool:
        """``@rank_zero_only``, or a decorator of this module whose wrapper calls the function
        it wraps only under a rank-0 guard (LAVIS's ``@main_process``)."""
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if last_name(target) in RANK_ZERO_DECORATORS:
            return True
        found = self.facts.function_of(ast.Call(func=target, args=[], keywords=[]))
        if found is None or found[0] is not self.facts or not found[1].args.args:
            return False
        wrapped = found[1].args.args[0].arg
        calls = [
            n for n in ast.walk(found[1])
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == wrapped
        ]  # fmt: skip
        return bool(calls) and all(self.main_only(c, within=True) for c in calls)

    def prints_replaced(self) -> bool:
        """``builtins.print`` is replaced by one that prints on the main process only
        (DeiT's, MAE's and torchvision's ``setup_for_distributed``), here or in a sibling, or
        the script calls ``setup_for_distributed`` / ``init_distributed_mode`` from elsewhere."""
        for facts in (self.facts, *self.facts.siblings.values()):
            for node in facts.nodes:
                if isinstance(node, ast.Assign) and any(
                    dotted(t) in ("builtins.print", "__builtin__.print", "__builtins__.print")
                    for t in node.targets
                ):
                    return True
        for call, _ in self.facts.calls():
            name = last_name(call.func)
            if name == "setup_for_distributed":
                return True
            if name == "init_distributed_mode" and self.facts.function_of(call) is None:
                return True
        return False


def _main_name(name: str) -> bool:
    """``is_data_parallel_master``, ``is_main_worker``, ``is_rank_zero_process``."""
    words = name.lower().split("_")
    return words[0] == "is" and bool(
        {"main", "master", "primary", "leader", "chief", "zero", "rank0"} & set(words[1:])
    )


def is_none(node: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def keyword_missing(call: ast.Call, name: str) -> bool:
    return all(k.arg != name for k in call.keywords)


def _combine(conjunction: bool, kinds: list[str | None]) -> str | None:
    if conjunction:  # `a and b` holds where both hold
        for kind in (MAIN, OFF, ONE, SINGLE):
            if kind in kinds:
                return kind
        return MULTI if kinds and all(k == MULTI for k in kinds) else None
    # `a or b` holds where either holds
    if all(k in (MAIN, SINGLE) for k in kinds):
        return MAIN if MAIN in kinds else SINGLE
    if kinds and all(k == OFF for k in kinds):
        return OFF
    return MULTI if kinds and all(k == MULTI for k in kinds) else None


def _number(node: ast.AST | None) -> int | None:
    """The int of a literal (``0``, ``-1``), else None (``True`` is not a number here)."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node, sign = node.operand, -1
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return sign * node.value
    if isinstance(node, ast.Constant) and node.value in ("0", "-1"):  # os.environ["RANK"] == "0"
        return int(node.value)
    return None


def _env(facts: ModuleFacts, node: ast.AST) -> str | None:
    return env_key(facts, node)
