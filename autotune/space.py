"""Search spaces: which configs of a template are valid for a problem on a device.

A space is a TOML file in `search_spaces/` (one per template): integer parameters with
their values, derived quantities and constraints written as small expressions over the
parameters and the problem (M, N, K, S = bytes per element, and the variant: F16, TA,
TB, BATCH, SHARED_B, ALPHA, BETA, BIAS, ACT = 0 none / 1 relu / 2 gelu, ACC_PIN = 0
auto / 1 f32 / 2 f16, VARIANT = 1 unless plain; quantized weights: QW = bits (0 for
none), QG = group (0: one scale per row), QZ = zero points, KP = K as stored, padded;
QA = 1 where the kernel quantizes A to int8 too).
The expressions are parsed
into a tiny whitelisted form (integers, + - * // %, comparisons, and/or/not, min, max,
cdiv); file text is never handed to `eval`.

Each space derives the quantities the adapter's limits apply to (invocations,
workgroup_size_x/y, workgroup_storage, grid_x/y), so the valid set is known exactly
before anything is compiled. Enumeration checks each constraint as soon as the
parameters it reads are bound, so large spaces are cut early.

A space whose file does not say `variants = true` computes only the plain problem (f32,
nn, one matrix, no epilogue): templates written before the variants existed, the user's
own included, are never handed a problem they would compute wrongly. Likewise only a
space that says `weights = true` is handed quantized weights (QW > 0), and only one
that says `activations = true` quantized activations (QA = 1).
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .data import template_sources
from .files import read_limited
from .plan import MAX_PASSES, MAX_WORKSPACES, OPERANDS, Plan, make_plan
from .problem import Problem, ProblemError

# The one-pass plan of a space without [[passes]] (see autotune/plan.py): entry point,
# workgroup size and grid, as expressions over the space's derived values.
DEFAULT_PASS = ("main", ("workgroup_size_x", "workgroup_size_y", "1"), ("grid_x", "grid_y", "1"))
DEFAULT_PASS_NEEDS = ("workgroup_size_x", "workgroup_size_y", "grid_x", "grid_y")
PROBLEM_NAMES = (
    "M", "N", "K", "S", "F16", "TA", "TB", "BATCH", "SHARED_B", "ALPHA", "BETA", "BIAS", "ACT",
    "ACC_PIN", "VARIANT", "QW", "QG", "QZ", "KP", "QA",
)  # fmt: skip
_PLAIN_ONLY = "VARIANT == 0"
_UNQUANTIZED_ONLY = "QW == 0"
_FLOAT_ACTIVATIONS_ONLY = "QA == 0"


class SpaceError(ValueError):
    """A malformed search-space file or an unknown template/config."""


@dataclass(frozen=True, order=True)
class Config:
    """One point of a template's space: the template's name and its integer parameters."""

    template: str
    params: tuple[tuple[str, int], ...]

    @classmethod
    def make(cls, template: str, params: Mapping[str, int]) -> Config:
        """A config from a name and integer parameters; anything else is refused (no
        "64" strings or 64.5 floats quietly becoming integers)."""
        if not isinstance(template, str) or not template.isidentifier():
            raise SpaceError(f"template name {str(template)[:40]!r} is not an identifier")
        for name, value in params.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise SpaceError(f"parameter name {str(name)[:40]!r} is not an identifier")
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise SpaceError(f"parameter {name} must be an integer, got {value!r:.40}")
        return cls(template, tuple(sorted((k, int(v)) for k, v in params.items())))

    @classmethod
    def parse(cls, text: str) -> Config:
        """The config of its text (str(config): "blocked BK=16 BM=128 ...")."""
        template, *pairs = text.split()
        return cls.make(template, {k: int(v) for k, v in (p.split("=") for p in pairs)})

    def as_dict(self) -> dict[str, int]:
        return dict(self.params)

    def __getitem__(self, name: str) -> int:
        return self.as_dict()[name]

    def __str__(self) -> str:
        return self.template + " " + " ".join(f"{k}={v}" for k, v in self.params)


# --- the expression form --------------------------------------------------------------

Expr = Callable[[Mapping[str, int]], int]

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS = {"min": min, "max": max, "cdiv": lambda a, b: -(-a // b)}


def compile_expression(text: str) -> tuple[Expr, frozenset[str]]:
    """Turn an expression string into (function of a name->int mapping, names it reads)."""
    if not isinstance(text, str) or len(text) > 500:
        raise SpaceError(f"expression must be a string of at most 500 characters: {text!r}")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as error:
        raise SpaceError(f"bad expression {text!r}: {error.msg}") from None
    names: set[str] = set()
    function = _build(tree, text, names)

    def guarded(env):
        try:
            return function(env)
        except ZeroDivisionError:  # a divisor that some problem makes 0 (a space's fault)
            values = ", ".join(f"{n}={env[n]}" for n in sorted(names) if n in env)
            raise SpaceError(f"expression {text!r} divides by zero at {values}") from None

    return guarded, frozenset(names)


def _build(node: ast.AST, text: str, names: set[str]) -> Expr:  # noqa: C901 (one case each)
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        value = int(node.value)
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        names.add(name)
        return lambda env: env[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        op, left, right = (
            _BINARY[type(node.op)],
            _build(node.left, text, names),
            _build(node.right, text, names),
        )
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
        inner = _build(node.operand, text, names)
        if isinstance(node.op, ast.USub):
            return lambda env: -inner(env)
        return lambda env: int(not inner(env))
    if isinstance(node, ast.BoolOp):
        parts = [_build(v, text, names) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: int(all(p(env) for p in parts))
        return lambda env: int(any(p(env) for p in parts))
    if isinstance(node, ast.Compare) and all(type(o) in _COMPARE for o in node.ops):
        terms = [_build(node.left, text, names)] + [
            _build(c, text, names) for c in node.comparators
        ]
        ops = [_COMPARE[type(o)] for o in node.ops]

        def compare(env):
            values = [t(env) for t in terms]
            return int(all(op(a, b) for op, a, b in zip(ops, values, values[1:], strict=False)))

        return compare
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        function, args = _FUNCTIONS[node.func.id], [_build(a, text, names) for a in node.args]
        return lambda env: function(*(a(env) for a in args))
    raise SpaceError(f"expression {text!r}: {ast.dump(node)[:60]} is not allowed")


# --- the space ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    name: str
    text: str
    function: Expr
    reads: frozenset[str]


@dataclass(frozen=True)
class _PassRule:
    """One declared pass: its entry point, and expressions of its workgroup size and grid
    (and of when it runs: None, always)."""

    entry_point: str
    workgroup_size: tuple[_Rule, _Rule, _Rule]
    grid: tuple[_Rule, _Rule, _Rule]
    when: _Rule | None = None


@dataclass(frozen=True)
class _WorkspaceRule:
    """One declared workspace: its size in bytes (the rule's name is the workspace's),
    and when the kernel has it (None, always). Its binding number is its place in the
    declarations either way."""

    size: _Rule
    when: _Rule | None = None


def _holds(when: _Rule | None, env: dict) -> bool:
    """Whether a pass or workspace with this `when` is in the plan at `env`."""
    return when is None or bool(when.function(env))


def _only_when(rule: _Rule, when: _Rule | None) -> _Rule:
    """`rule`'s value where `when` holds, else 0 (a pass or workspace the plan leaves
    out needs nothing of a limit)."""
    if when is None:
        return rule
    value, holds = rule.function, when.function
    return _Rule(
        rule.name,
        f"{rule.text} (where {when.text})",
        lambda env: value(env) if holds(env) else 0,
        rule.reads | when.reads,
    )


@dataclass
class Space:
    """A template's parameters, derived quantities, constraints and launch plan (TOML)."""

    template: str
    description: str
    params: dict[str, tuple[int, ...]]
    derived: list[_Rule]
    constraints: list[_Rule]
    seeds: list[dict[str, int]] = field(default_factory=list)
    variants: bool = False  # computes variant problems too (f16, layouts, batch, epilogue)
    passes: list[_PassRule] = field(default_factory=list)
    workspaces: list[_WorkspaceRule] = field(default_factory=list)
    version: int = 1  # raised when what a config means changes without its WGSL changing
    weights: bool = False  # computes problems with quantized weights (and only those)

    @classmethod
    def from_toml(cls, text: str, template: str) -> Space:
        data = _extended(_parsed(text, template), template)
        for table, kind in (("params", dict), ("derived", dict), ("constraints", dict),
                            ("seeds", list), ("passes", list), ("workspaces", list)):  # fmt: skip
            if not isinstance(data.get(table, kind()), kind):
                raise SpaceError(f"search space {template!r}: {table} must be a {kind.__name__}")
        params = {}
        for name, values in data.get("params", {}).items():
            if not name.isidentifier() or name in PROBLEM_NAMES:
                raise SpaceError(f"search space {template!r}: bad parameter name {name!r}")
            if (
                not isinstance(values, list)
                or not values
                or not all(type(v) in (int, bool) for v in values)
            ):
                raise SpaceError(f"search space {template!r}: {name} must list integers")
            params[name] = tuple(int(v) for v in values)
        derived = [_rule(n, t) for n, t in data.get("derived", {}).items()]
        constraints = [_rule(n, t) for n, t in data.get("constraints", {}).items()]
        passes, workspaces = _plan_rules(data, template, {d.name for d in derived})
        if all(p.when for p in passes):  # a config whose plan keeps no pass is not one
            constraints.append(
                _rule("a_pass_runs", " or ".join(f"({p.when.text})" for p in passes))
            )
        known = set(params) | set(PROBLEM_NAMES)  # a rule reads only names defined above it
        rules = [("derive", d) for d in derived] + [("check", c) for c in constraints]
        rules += [("check", r) for r in _plan_expressions(passes, workspaces)]
        for kind, rule in rules:
            unknown = rule.reads - known
            if unknown:
                raise SpaceError(f"search space {template!r}: {rule.name} reads {sorted(unknown)}")
            if kind == "derive":
                known.add(rule.name)
        if not all(isinstance(seed, dict) for seed in data.get("seeds", [])):
            raise SpaceError(f"search space {template!r}: each seed must be a table")
        seeds = [dict(s) for s in data.get("seeds", [])]
        for seed in seeds:
            if set(seed) != set(params):
                raise SpaceError(f"search space {template!r}: seed {seed} must set {list(params)}")
        variants = data.get("variants", False)
        if type(variants) is not bool:
            raise SpaceError(f"search space {template!r}: variants must be true or false")
        if not variants:
            constraints.insert(0, _rule("plain_problem_only", _PLAIN_ONLY))
        weights = data.get("weights", False)
        if type(weights) is not bool:
            raise SpaceError(f"search space {template!r}: weights must be true or false")
        if not weights:
            constraints.insert(0, _rule("unquantized_weights_only", _UNQUANTIZED_ONLY))
        activations = data.get("activations", False)
        if type(activations) is not bool:
            raise SpaceError(f"search space {template!r}: activations must be true or false")
        if not activations:
            constraints.insert(0, _rule("float_activations_only", _FLOAT_ACTIVATIONS_ONLY))
        description = str(data.get("description", ""))
        version = data.get("version", 1)
        if type(version) is not int or version < 1:
            raise SpaceError(f"search space {template!r}: version must be an integer >= 1")
        return cls(
            template,
            description,
            params,
            derived,
            constraints,
            seeds,
            variants,
            passes,
            workspaces,
            version,
            weights,
        )

    @property
    def size(self) -> int:
        """Number of raw parameter combinations, before any constraint."""
        count = 1
        for values in self.params.values():
            count *= len(values)
        return count

    def _rules(self, limits: Mapping[str, int] | None) -> list[tuple[str, _Rule]]:
        """Derived values and checks in evaluation order: ("derive"|"check", rule); the
        device's limits apply to the plan's quantities (plan.Plan.needs)."""
        rules = [("derive", d) for d in self.derived] + [("check", c) for c in self.constraints]
        if limits is not None:
            for limit, (function, reads, text) in self._quantities.items():
                if limit in limits:
                    bound = int(limits[limit])
                    check = _at_most(function, bound)
                    rules.append(
                        ("check", _Rule(f"limit {limit}", f"{text} <= {bound}", check, reads))
                    )
        return rules

    @functools.cached_property
    def _quantities(self) -> dict[str, tuple[Expr, frozenset[str], str]]:
        """Limit -> (what the plan needs of it, as a function of the values; the names
        it reads; its text), in the order of plan.Plan.needs."""
        quantities = {}

        def most(limit, rules, combine=max):
            functions = [r.function for r in rules]
            reads = frozenset().union(*(r.reads for r in rules))
            text = ", ".join(dict.fromkeys(r.text for r in rules))
            quantities[limit] = (lambda env: combine(f(env) for f in functions), reads, text)

        passes = self.passes
        invocations = []
        for p in passes:
            size = p.workgroup_size
            text = " * ".join(r.text for r in size)
            rule = _Rule("invocations", text, _product(size), _reads(size))
            invocations.append(_only_when(rule, p.when))
        most("max-compute-invocations-per-workgroup", invocations)
        for axis, letter in enumerate("xyz"):
            sizes = [_only_when(p.workgroup_size[axis], p.when) for p in passes]
            most(f"max-compute-workgroup-size-{letter}", sizes)
        if any(d.name == "workgroup_storage" for d in self.derived):
            storage = _rule("workgroup_storage", "workgroup_storage")
            most("max-compute-workgroup-storage-size", [storage])
        grids = [_only_when(r, p.when) for p in passes for r in p.grid]
        most("max-compute-workgroups-per-dimension", grids)
        if self.workspaces:
            sizes = [_only_when(w.size, w.when) for w in self.workspaces]
            most("max-storage-buffer-binding-size", sizes)
            most("max-buffer-size", sizes)
        return quantities

    def plan(self, config: Config, problem: Problem) -> Plan:
        """The launch plan of `config` at `problem` (the config must be valid here)."""
        env = self.context(config, problem)
        passes = [
            (
                p.entry_point,
                tuple(r.function(env) for r in p.workgroup_size),
                tuple(r.function(env) for r in p.grid),
            )
            for p in self.passes
            if _holds(p.when, env)
        ]
        workspaces = [
            (index, w.size.name, w.size.function(env))
            for index, w in enumerate(self.workspaces)
            if _holds(w.when, env)
        ]
        storage, vector = env.get("workgroup_storage", 0), env.get("VEC", 1)
        return make_plan(problem, passes, workspaces, storage, vector)

    def _schedule(self, limits) -> list[list[tuple[str, _Rule]]]:
        """Group rules by the index of the last parameter they depend on (-1: none)."""
        order = list(self.params)
        depth: dict[str, int] = {name: i for i, name in enumerate(order)}
        levels: list[list[tuple[str, _Rule]]] = [[] for _ in range(len(order) + 1)]
        for kind, rule in self._rules(limits):
            level = max((depth.get(n, -1) for n in rule.reads), default=-1)
            if kind == "derive":
                depth[rule.name] = level
            levels[level + 1].append((kind, rule))
        return levels

    def configs(self, problem: Problem, limits: Mapping[str, int] | None = None) -> list[Config]:
        """Every config valid for `problem` under `limits` (None: ignore device limits)."""
        return [Config.make(self.template, p) for p in self._enumerate(problem, limits)]

    def _enumerate(self, problem, limits) -> Iterator[dict[str, int]]:
        names = list(self.params)
        levels = self._schedule(limits)
        env = _problem_env(problem)

        def apply(level) -> bool:
            for kind, rule in levels[level]:
                value = rule.function(env)
                if kind == "derive":
                    env[rule.name] = value
                elif not value:
                    return False
            return True

        def walk(i):
            if i == len(names):
                yield {n: env[n] for n in names}
                return
            for value in self.params[names[i]]:
                env[names[i]] = value
                if apply(i + 1):
                    yield from walk(i + 1)

        if apply(0):
            yield from walk(0)

    def why_invalid(self, config: Config, problem: Problem, limits=None) -> str | None:
        """None when `config` is valid here, else the first rule it breaks."""
        if config.template != self.template:
            return f"template {config.template!r} is not {self.template!r}"
        values = config.as_dict()
        if set(values) != set(self.params):
            return f"parameters {sorted(values)} are not {sorted(self.params)}"
        for name, value in values.items():
            if value not in self.params[name]:
                return f"{name}={value} is not one of {list(self.params[name])}"
        env = _problem_env(problem) | values
        for kind, rule in self._rules(limits):
            value = rule.function(env)
            if kind == "derive":
                env[rule.name] = value
            elif not value:
                return f"{rule.name}: {rule.text}"
        return None

    def context(self, config: Config, problem: Problem) -> dict[str, int]:
        """Parameters, problem and derived values: what the template is rendered with."""
        env = _problem_env(problem) | config.as_dict()
        for rule in self.derived:
            env[rule.name] = rule.function(env)
        return env

    def first_config(self, problem: Problem, limits=None) -> Config | None:
        """Some valid config (the first in enumeration order), found without listing all."""
        params = next(self._enumerate(problem, limits), None)
        return None if params is None else Config.make(self.template, params)

    def seed_configs(self, problem: Problem, limits=None) -> list[Config]:
        """The file's known-good configs that are valid for this problem, in file order."""
        seeds = [Config.make(self.template, s) for s in self.seeds]
        return [c for c in seeds if self.why_invalid(c, problem, limits) is None]


def _parsed(text: str, template: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpaceError(f"search space {template!r}: {error}") from None
    except RecursionError:  # arrays nested thousands deep: not a space of ours
        raise SpaceError(f"search space {template!r}: nested too deeply") from None


# What a space that `extends` another takes from it: these tables, its own entries
# added after the base's (or replacing them by name); the rest (seeds, plan, variants,
# version, description) is its own.
INHERITED = ("params", "derived", "constraints")


def _extended(data: dict, template: str) -> dict:
    """`data` with the space it extends merged in (one level: the base extends nothing).
    `drop` lists constraints of the base the extension does not keep."""
    base_name = data.get("extends")
    if base_name is None:
        if "drop" in data:
            raise SpaceError(f"search space {template!r}: drop without extends")
        return data
    if base_name == template or not isinstance(base_name, str):
        raise SpaceError(f"search space {template!r}: extends {str(base_name)[:40]!r}")
    base = _parsed(_read_space(_space_path(base_name)), base_name)
    if "extends" in base:
        raise SpaceError(f"search space {template!r}: its base {base_name!r} extends another")
    merged = dict(data)
    for table in INHERITED:
        own = data.get(table, {})
        if not isinstance(own, dict):
            raise SpaceError(f"search space {template!r}: {table} must be a dict")
        merged[table] = base.get(table, {}) | own
    drop = data.get("drop", [])
    if not isinstance(drop, list) or not all(
        isinstance(name, str) and name in merged["constraints"] for name in drop
    ):
        raise SpaceError(f"search space {template!r}: drop must list constraints of {base_name!r}")
    for name in drop:
        del merged["constraints"][name]
    return merged


def space_files(template: str) -> list[Path]:
    """The files a template's space is read from: its own, then the one it extends."""
    path = _space_path(template)
    stat = path.stat()
    base = _base_of(template, path, stat.st_mtime_ns, stat.st_size)
    sources = template_sources()
    return [path, sources[base][1]] if isinstance(base, str) and base in sources else [path]


@functools.lru_cache(maxsize=64)
def _base_of(template: str, path: Path, mtime_ns: int, size: int) -> object:
    return _parsed(_read_space(path), template).get("extends")


def _space_path(template: str) -> Path:
    sources = template_sources()
    if template not in sources:
        raise SpaceError(f"template {template!r} is unknown; known: {', '.join(sorted(sources))}")
    return sources[template][1]


def _read_space(path: Path) -> str:
    try:  # a user's template folder may hold anything named *.toml: a FIFO, a link
        return read_limited(path, MAX_SPACE_FILE_BYTES).decode()
    except (OSError, ValueError) as error:
        raise SpaceError(f"{path}: {error}") from None


def _rule(name: str, text: str) -> _Rule:
    function, reads = compile_expression(text)
    return _Rule(str(name), text, function, reads)


def _at_most(function: Expr, bound: int) -> Expr:
    return lambda env: int(function(env) <= bound)


def _product(rules) -> Expr:
    functions = [r.function for r in rules]
    return lambda env: math.prod(f(env) for f in functions)


def _reads(rules) -> frozenset[str]:
    return frozenset().union(*(r.reads for r in rules))


def _plan_rules(data: dict, template: str, derived: set[str]):
    """The [[passes]] and [[workspaces]] of a space file as expressions (see plan.py);
    without [[passes]], the one-pass plan of the built-in templates."""
    where = f"search space {template!r}"
    declared = data.get("passes")
    if declared is None:
        missing = [n for n in DEFAULT_PASS_NEEDS if n not in derived]
        if missing:
            raise SpaceError(f"{where} must derive {missing} (or declare [[passes]])")
        entry, size, grid = DEFAULT_PASS
        grid = grid[:2] + (("grid_z",) if "grid_z" in derived else ("1",))
        declared = [{"entry_point": entry, "workgroup_size": list(size), "grid": list(grid)}]
    if not isinstance(declared, list) or not 1 <= len(declared) <= MAX_PASSES:
        raise SpaceError(f"{where}: [[passes]] must list 1 to {MAX_PASSES} passes")
    passes = []
    for item in declared:
        keys = {"entry_point", "workgroup_size", "grid"}
        if not isinstance(item, dict) or not keys <= set(item) <= keys | {"when"}:
            raise SpaceError(f"{where}: a pass has entry_point, workgroup_size and grid (and when)")
        entry = item["entry_point"]
        if not isinstance(entry, str) or not entry.isidentifier() or not entry.isascii():
            raise SpaceError(f"{where}: entry_point {str(entry)[:40]!r} is not an identifier")
        triples = []
        for what in ("workgroup_size", "grid"):
            texts = item[what]
            if not isinstance(texts, list) or len(texts) != 3:
                raise SpaceError(f"{where}: pass {entry}: {what} must list 3 expressions")
            triples.append(tuple(_rule(f"{entry} {what}", str(t)) for t in texts))
        passes.append(_PassRule(entry, *triples, _when(item, f"{entry} when", where)))
    workspaces = []
    for item in data.get("workspaces", []):
        keys = {"name", "bytes"}
        if not isinstance(item, dict) or not keys <= set(item) <= keys | {"when"}:
            raise SpaceError(f"{where}: a workspace has a name and bytes (and when)")
        name = item["name"]
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise SpaceError(f"{where}: workspace name {str(name)[:40]!r} is not an identifier")
        taken = {n for _, n, _ in OPERANDS} | {w.size.name for w in workspaces}
        if name in taken:  # buffers are bound by name: one name, one buffer
            raise SpaceError(f"{where}: workspace name {name!r} is already a buffer's")
        rule = _rule(name, str(item["bytes"]))
        workspaces.append(_WorkspaceRule(rule, _when(item, f"{name} when", where)))
    if len(workspaces) > MAX_WORKSPACES:
        raise SpaceError(f"{where}: at most {MAX_WORKSPACES} workspaces")
    return passes, workspaces


def _when(item: dict, name: str, where: str) -> _Rule | None:
    """A declaration's `when`: the expression that says where the plan has it."""
    if "when" not in item:
        return None
    if not isinstance(item["when"], str):
        raise SpaceError(f"{where}: {name} must be an expression in a string")
    return _rule(name, item["when"])


def _plan_expressions(passes: list[_PassRule], workspaces: list[_WorkspaceRule]) -> list[_Rule]:
    rules = [r for p in passes for r in p.workgroup_size + p.grid]
    rules += [w.size for w in workspaces] + [w.when for w in workspaces if w.when]
    return rules + [p.when for p in passes if p.when]


def _problem_env(problem: Problem) -> dict[str, int]:
    ops = problem.ops
    return {
        "M": problem.M,
        "N": problem.N,
        "K": problem.K,
        "S": problem.itemsize,
        "F16": int(problem.dtype == "f16"),
        "TA": int(problem.trans_a),
        "TB": int(problem.trans_b),
        "BATCH": problem.batch,
        "SHARED_B": int(problem.shared_b),
        "ALPHA": int("alpha" in ops),
        "BETA": int("beta" in ops),
        "BIAS": int("bias" in ops),
        "ACT": {None: 0, "relu": 1, "gelu": 2}[problem.activation],
        "ACC_PIN": ("auto", "f32", "f16").index(problem.accumulate),
        "VARIANT": int(not problem.plain),
        **_weight_env(problem),
    }


def _weight_env(problem: Problem) -> dict[str, int]:
    if not problem.quantized:
        return {"QW": 0, "QG": 0, "QZ": 0, "KP": problem.K, "QA": 0}
    bits, group, zero_points = problem.weight_format
    qa = int(problem.activations == "q8")
    return {"QW": bits, "QG": group or 0, "QZ": int(zero_points), "KP": problem.padded_k, "QA": qa}


def template_names() -> list[str]:
    return sorted(template_sources())


def load_space(template: str) -> Space:
    """The search space of `template`, from its TOML file (search_spaces/TEMPLATE.toml)."""
    paths = space_files(template)
    stamps = tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    return _load_space(template, paths[0], stamps)  # an edited file is loaded again


MAX_SPACE_FILE_BYTES = 2**20  # ours are a few KiB


@functools.lru_cache(maxsize=64)
def _load_space(template: str, path: Path, stamps: tuple) -> Space:
    return Space.from_toml(_read_space(path), template)


def _rule_every_seed_breaks(space: Space, problem: Problem) -> str | None:
    """ "gemv: decode_shapes: M <= 16" where each of the space's known-good configs first
    breaks that one rule at `problem` (most likely what rules the family out), else None."""
    seeds = [Config.make(space.template, s) for s in space.seeds]
    reasons = {space.why_invalid(c, problem) for c in seeds}
    return (
        f"{space.template}: {reasons.pop()}" if len(reasons) == 1 and None not in reasons else None
    )


def check_runnable(problem: Problem, limits: Mapping[str, int], templates) -> None:
    """Raise ProblemError naming the device limit when no config of `templates` can run
    `problem` within `limits` (e.g. more than 65535 workgroups in a dimension for every
    tile size). Such problems are refused, not split."""
    spaces = [load_space(t) for t in templates]
    if any(space.first_config(problem, limits) for space in spaces):
        return
    broken = {}
    for space in spaces:  # what the configs valid without device limits run into
        config = space.first_config(problem, None)
        reason = config and space.why_invalid(config, problem, limits) or ""
        if reason.startswith("limit "):
            name, _, rule = reason.removeprefix("limit ").partition(": ")
            broken.setdefault(name, f"{name} = {limits[name]}")
    if not broken:
        plain_only = [s.template for s in spaces if not s.variants]
        if not problem.plain and plain_only == [s.template for s in spaces]:
            raise ProblemError(
                "template",
                f"{', '.join(plain_only)} compute only the plain problem (f32, nn, one "
                f"matrix, no epilogue), not {problem}; the variants are blockedx's, gemv's "
                "and splitk's",
            )
        rules = "; ".join(filter(None, (_rule_every_seed_breaks(s, problem) for s in spaces)))
        raise ProblemError(
            "shape",
            f"no config of {', '.join(templates)} is valid for {problem}"
            + (f" ({rules})" if rules else ""),
        )
    what, blamed = problem.shape, "shape"
    one = replace(problem, batch=1, shared_b=False)
    if problem.batch > 1 and any(space.first_config(one, limits) for space in spaces):
        # one matrix would run: the batch is what is too large (workgroups along z)
        what, blamed = f"batch {problem.batch} of {problem.shape}", "batch"
    raise ProblemError(
        blamed,
        f"{what} is beyond this device's limits for every config of "
        f"{', '.join(templates)}: {'; '.join(broken.values())}",
    )
