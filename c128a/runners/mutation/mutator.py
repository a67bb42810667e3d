"""Mutants of a module's kernels, made on its AST.

Each mutant changes one expression of one kernel function (by default, one
decorated with ``triton.jit``) and nothing else: the module's text is kept
byte for byte around the changed expression, so line numbers, comments and
the host code stay as they were, and Triton (which reads a kernel's source
from its file) sees the mutated kernel. The kinds follow the classic
mutation operators of mutmut, cosmic-ray and PIT, one likely slip per
operator rather than every operator for every other (each mutant costs a
run of the suite):

- ``operator``: an arithmetic or bitwise operator replaced (``+``/``-``,
  ``*`` to ``//``, ``//`` to ``*`` and to ``%``, ``%`` to ``//``, ``/`` to
  ``*``, ``<<``/``>>``, ``&``/``|``, ``^`` to ``&``), the same in an
  augmented assignment (``+=``), ``and``/``or``, a unary ``-``, ``~`` or
  ``not`` dropped, and ``minimum``/``maximum`` swapped (a kernel's clamp);
- ``comparison``: a comparison moved across its boundary (``<`` to ``<=``)
  and negated (``<`` to ``>=``); ``==``/``!=`` negated;
- ``constant``: an integer or float literal n to n + 1 and n - 1 (a negative
  literal such as ``-1`` counts as one), ``True``/``False`` swapped;
- ``mask``: a load's or store's ``mask=`` dropped (``mask=None``; a load's
  ``other=`` with it, which Triton refuses without a mask), one side
  of an ``&`` dropped in a mask, in a ``where`` condition or in what the
  kernel assigns to a name one of them reads (``is_decode = is_token &
  ...``), a ``where`` replaced by either of its values (its condition always
  true, always false);
- ``condition``: an ``if`` whose test is not a comparison negated (a flag
  that picks a fast path).

A mutant's :attr:`Mutant.id` is a hash of where it is (the kernel function)
and what it changes (the expression before and after, and which occurrence
of that change in the function it is), not of its line: an edit elsewhere in
the file keeps every other mutant's id, so a list of equivalent mutants
stays valid. Importing this module imports neither torch nor Triton.
"""

from __future__ import annotations

import ast
import hashlib
from collections import Counter
from dataclasses import dataclass, field

KINDS = ("operator", "comparison", "constant", "mask", "condition")
DEFAULT_DECORATORS = ("triton.jit", "jit")

BINARY_REPLACEMENTS: dict[type, tuple[type, ...]] = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.FloorDiv,),
    ast.FloorDiv: (ast.Mult, ast.Mod),
    ast.Mod: (ast.FloorDiv,),
    ast.Div: (ast.Mult,),
    ast.Pow: (ast.Mult,),
    ast.LShift: (ast.RShift,),
    ast.RShift: (ast.LShift,),
    ast.BitAnd: (ast.BitOr,),
    ast.BitOr: (ast.BitAnd,),
    ast.BitXor: (ast.BitAnd,),
}
"""Each operator's replacements: the slip most likely in integer index code."""

COMPARISON_REPLACEMENTS: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
"""Each comparison's boundary shift, then its negation."""

SWAPPED_FUNCTIONS = {"minimum": "maximum", "maximum": "minimum"}
MASKED_CALLS = ("load", "store")
WHERE = "where"


@dataclass(frozen=True)
class Mutant:
    """One mutant: ``kind`` of change in kernel ``function`` at ``line`` and
    ``column`` (from 1), the expression ``original`` become ``replacement``
    in ``statement`` (each as ``ast.unparse`` writes it, on one line; a
    compound statement by its header); ``occurrence`` counts the same change
    in the same statement text; ``source`` is the whole mutated module."""

    subject: str
    function: str
    kind: str
    line: int
    column: int
    statement: str
    original: str
    replacement: str
    occurrence: int
    source_line: str
    source: str = field(repr=False, compare=False)

    @property
    def id(self) -> str:
        """``SUBJECT-HASH``: stable while the kernel function keeps this statement."""
        key = "|".join((self.function, self.statement, self.kind, self.original,
                        self.replacement, str(self.occurrence)))
        return f"{self.subject}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"

    @property
    def mutation(self) -> str:
        """``original -> replacement``, as the report shows it."""
        return f"{self.original} -> {self.replacement}"

    def describe(self) -> str:
        return f"{self.function}:{self.line}:{self.column} [{self.kind}] {self.mutation}"


@dataclass(frozen=True)
class _Edit:
    node: ast.AST
    kind: str
    replacement: ast.AST
    statement: bool = False  # the node is a statement: no parentheses around it


def mutants_of(
    source: str, subject: str, decorators: tuple[str, ...] = DEFAULT_DECORATORS
) -> list[Mutant]:
    """Every mutant of the functions of ``source`` decorated with one of
    ``decorators`` (dotted names, called or not: ``triton.jit`` matches
    ``@triton.jit`` and ``@triton.jit(do_not_specialize=...)``), in source
    order. Mutants whose text equals the original or an earlier mutant's are
    left out; every one left compiles."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    offsets = _line_offsets(lines)
    seen = {source}
    occurrences: Counter[tuple] = Counter()
    mutants = []
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef) or not _decorated(function, decorators):
            continue
        for statement, edit in _edits(function):
            node = edit.node
            text = _unparse(edit.replacement)
            start = offsets[node.lineno - 1] + _char_column(lines, node.lineno, node.col_offset)
            end = offsets[node.end_lineno - 1] + _char_column(lines, node.end_lineno,
                                                              node.end_col_offset)
            # A change spanning several lines keeps them (inside its brackets),
            # so every later line, and Triton's view of it, keeps its number.
            kept_lines = "\n" * (node.end_lineno - node.lineno)
            mutated = (source[:start] + (text if edit.statement else f"({text}{kept_lines})")
                       + source[end:])
            if mutated in seen:
                continue
            seen.add(mutated)
            compile(mutated, f"<mutant of {subject}>", "exec")  # one that cannot is a bug here
            original = _unparse(node)
            key = (function.name, statement, edit.kind, original, text)
            occurrences[key] += 1
            mutants.append(Mutant(
                subject=subject, function=function.name, kind=edit.kind, line=node.lineno,
                column=_char_column(lines, node.lineno, node.col_offset) + 1,
                statement=statement, original=original, replacement=text,
                occurrence=occurrences[key], source_line=lines[node.lineno - 1].strip(),
                source=mutated,
            ))
    return mutants


# ---------------------------------------------------------------- which functions


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _decorated(function: ast.FunctionDef, decorators: tuple[str, ...]) -> bool:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if _dotted(target) in decorators:
            return True
    return False


# ---------------------------------------------------------------- the edits


def _edits(function: ast.FunctionDef):
    """(statement, edit) of every edit of ``function``'s body (not its
    signature or decorators), in source order; the statement is the one the
    edited expression belongs to (a compound statement's header)."""
    masks = _mask_expressions(function)
    negated = {id(node.operand) for node in ast.walk(function)
               if isinstance(node, ast.UnaryOp) and _is_number(node)}
    edits = []
    for statement, roots in _statements(function.body):
        context = _header(statement)
        for node in (node for root in roots for node in ast.walk(root)):
            found = (_operator_edits(node) + _comparison_edits(node)
                     + _constant_edits(node, negated) + _mask_edits(node, masks))
            edits += [(context, edit) for edit in found]
        if isinstance(statement, ast.AugAssign):
            edits += [(context, edit) for edit in _augmented_edits(statement)]
        if isinstance(statement, (ast.If, ast.While)):
            edits += [(context, edit) for edit in _condition_edits(statement)]
    return sorted(edits, key=lambda e: (e[1].node.lineno, e[1].node.col_offset,
                                        KINDS.index(e[1].kind)))


def _statements(body: list[ast.stmt]):
    """(statement, the expressions that are its own) for every statement
    of ``body`` and of the blocks inside it; a docstring and nested
    functions are left out."""
    for statement in body:
        if (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)):
            continue
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(statement, (ast.If, ast.While)):
            yield statement, [statement.test]
        elif isinstance(statement, ast.For):
            yield statement, [statement.target, statement.iter]
        elif isinstance(statement, ast.With):
            yield statement, list(statement.items)
        elif isinstance(statement, ast.AugAssign):
            yield statement, [statement.target, statement.value]
        else:
            yield statement, [statement]
        for block in ("body", "orelse"):
            yield from _statements(getattr(statement, block, None) or [])


def _header(statement: ast.stmt) -> str:
    """A statement as a mutant's id reads it: a simple statement whole, a
    compound one by its header."""
    if isinstance(statement, (ast.If, ast.While)):
        return f"{type(statement).__name__.lower()} {_unparse(statement.test)}:"
    if isinstance(statement, ast.For):
        return f"for {_unparse(statement.target)} in {_unparse(statement.iter)}:"
    if isinstance(statement, ast.With):
        return f"with {', '.join(_unparse(item) for item in statement.items)}:"
    return _unparse(statement)


def _replaced(node: ast.AST, **changes) -> ast.AST:
    """A copy of ``node`` with ``changes`` (its children shared, not copied)."""
    fields = {name: getattr(node, name) for name in node._fields}
    fields.update(changes)
    return type(node)(**fields)


def _operator_edits(node: ast.AST) -> list[_Edit]:
    edits = []
    if isinstance(node, ast.BinOp):
        for new in BINARY_REPLACEMENTS.get(type(node.op), ()):
            edits.append(_Edit(node, "operator", _replaced(node, op=new())))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        edits.append(_Edit(node, "operator", _replaced(node, op=new())))
    elif isinstance(node, ast.UnaryOp) and not _is_number(node):
        if isinstance(node.op, (ast.USub, ast.Invert, ast.Not)):
            edits.append(_Edit(node, "operator", node.operand))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        swapped = SWAPPED_FUNCTIONS.get(node.func.attr)
        if swapped:
            edits.append(_Edit(node, "operator",
                               _replaced(node, func=_replaced(node.func, attr=swapped))))
    return edits


def _comparison_edits(node: ast.AST) -> list[_Edit]:
    if not isinstance(node, ast.Compare):
        return []
    edits = []
    for index, op in enumerate(node.ops):
        for new in COMPARISON_REPLACEMENTS.get(type(op), ()):
            ops = list(node.ops)
            ops[index] = new()
            edits.append(_Edit(node, "comparison", _replaced(node, ops=ops)))
    return edits


def _is_number(node: ast.AST) -> bool:
    """A numeric literal, a negative one (``-1``) included."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool))


def _number(value) -> ast.AST:
    if value < 0:
        return ast.UnaryOp(ast.USub(), ast.Constant(-value))
    return ast.Constant(value)


def _constant_edits(node: ast.AST, negated: set[int]) -> list[_Edit]:
    """n to n + 1 and n - 1; ``negated``: the ids of the literals of ``-n``
    (mutated as -n, not on their own)."""
    if isinstance(node, ast.UnaryOp) and _is_number(node):
        value = -node.operand.value
    elif _is_number(node):
        if id(node) in negated:
            return []
        value = node.value
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return [_Edit(node, "constant", ast.Constant(not node.value))]
    else:
        return []
    return [_Edit(node, "constant", _number(value + 1)), _Edit(node, "constant", _number(value - 1))]


def _mask_expressions(function: ast.FunctionDef) -> set[int]:
    """The ids of the expressions that mask something: a load's or store's
    ``mask=`` value, a ``where``'s condition, and what the function assigns
    to a name any of these reads (``is_decode = is_token & ...``)."""
    masks: list[ast.AST] = []
    for node in ast.walk(function):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr in MASKED_CALLS:
            masks += [k.value for k in node.keywords if k.arg == "mask"]
        elif node.func.attr == WHERE and node.args:
            masks.append(node.args[0])
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, []).append(node.value)
    found: dict[int, ast.AST] = {}
    while masks:
        mask = masks.pop()
        if id(mask) in found:
            continue
        found[id(mask)] = mask
        for name in (n.id for n in ast.walk(mask) if isinstance(n, ast.Name)):
            masks += assigned.get(name, [])
    return set(found)


def _conjuncts_in(node: ast.AST):
    """The ``&`` nodes a mask is made of (through nested ``&`` and brackets)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
        yield node
        yield from _conjuncts_in(node.left)
        yield from _conjuncts_in(node.right)
    elif isinstance(node, ast.Subscript):  # ``(a & b)[:, None]``
        yield from _conjuncts_in(node.value)


def _mask_edits(node: ast.AST, masks: set[int]) -> list[_Edit]:
    edits = []
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in MASKED_CALLS):
        keywords = {keyword.arg: keyword for keyword in node.keywords}
        if "mask" in keywords and "other" in keywords:
            # Triton refuses other= without a mask (a compile error, not a
            # mutant): the load loses both.
            unmasked = ast.Call(node.func, node.args, [k for k in node.keywords
                                                       if k.arg not in ("mask", "other")])
            edits.append(_Edit(node, "mask", unmasked))
        elif "mask" in keywords:
            edits.append(_Edit(keywords["mask"].value, "mask", ast.Constant(None)))
    if id(node) in masks:
        for conjunct in _conjuncts_in(node):
            edits.append(_Edit(conjunct, "mask", conjunct.left))
            edits.append(_Edit(conjunct, "mask", conjunct.right))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == WHERE and len(node.args) == 3):
        edits.append(_Edit(node, "mask", node.args[1]))
        edits.append(_Edit(node, "mask", node.args[2]))
    return edits


def _augmented_edits(statement: ast.AugAssign) -> list[_Edit]:
    return [_Edit(statement, "operator", _replaced(statement, op=new()), statement=True)
            for new in BINARY_REPLACEMENTS.get(type(statement.op), ())]


def _condition_edits(statement: ast.If | ast.While) -> list[_Edit]:
    """An ``if`` on a flag (not a comparison, which has its own mutants) negated."""
    test = statement.test
    if isinstance(statement, ast.If) and not isinstance(test, (ast.Compare, ast.BoolOp)):
        return [_Edit(test, "condition", ast.UnaryOp(ast.Not(), test))]
    return []


# ---------------------------------------------------------------- text


def _unparse(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


def _line_offsets(lines: list[str]) -> list[int]:
    offsets, total = [], 0
    for line in lines:
        offsets.append(total)
        total += len(line)
    return offsets


def _char_column(lines: list[str], lineno: int, byte_column: int) -> int:
    """The AST's column (UTF-8 bytes) as a character index into the line."""
    return len(lines[lineno - 1].encode()[:byte_column].decode())
