"""Finite-domain constraint propagation: which values of a few variables can
hold at once under rules over small groups of them.

The machinery behind the constraint model (:mod:`.constraints`) and the
covering array (:mod:`.schedule`), kept free of what the variables mean.
Each variable has a handful of values; a domain is a bitmask of the values
still possible. A :class:`Table` is one rule compiled over its variables:
the value tuples it allows, and the reason of each it forbids. Propagation
is generalised arc consistency (each rule keeps a value only while some
allowed tuple of the values still possible supports it, as PICT and ACTS
derive implied exclusions); :func:`complete` searches for a full
assignment. When propagation empties a domain, :class:`Contradiction`
carries the reasons of the rules that led there, the forbidding rule's
first.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

Reason = Callable[[tuple[int, ...]], str]
"""The reason a rule forbids a tuple of value indices."""


def _bits(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


SMALL_MASKS = tuple(_bits(mask) for mask in range(1 << 10))


def bits(mask: int) -> tuple[int, ...]:
    """The value indices set in ``mask``, lowest first."""
    return SMALL_MASKS[mask] if mask < len(SMALL_MASKS) else _bits(mask)


@dataclass(frozen=True)
class Table:
    """One rule over ``scope`` (variable indices): the value tuples it
    allows, and ``reason(tuple)`` for a tuple it forbids."""

    scope: tuple[int, ...]
    allowed: frozenset[tuple[int, ...]]
    reason: Reason
    tag: str = ""  # what kind of rule it is (the model's: contract or budget)
    supports: tuple = field(default=(), compare=False)  # per value(s), the last variable's mask

    @classmethod
    def of(cls, scope: Sequence[int], sizes: Sequence[int], forbids: Callable, tag: str = ""):
        """The table of a rule whose ``forbids(values)`` returns the reason a
        tuple of value indices is forbidden, None where it is allowed."""
        scope = tuple(scope)
        allowed, reasons = set(), {}
        for values in itertools.product(*(range(sizes[v]) for v in scope)):
            reason = forbids(values)
            if reason is None:
                allowed.add(values)
            else:
                reasons[values] = reason
        supports = ()
        if len(scope) == 2:
            forward = [0] * sizes[scope[0]]
            for a, b in allowed:
                forward[a] |= 1 << b
            supports = tuple(forward)
        elif len(scope) == 3:
            last = [[0] * sizes[scope[1]] for _ in range(sizes[scope[0]])]
            for a, b, c in allowed:
                last[a][b] |= 1 << c
            supports = tuple(map(tuple, last))
        elif len(scope) == 4:
            last = [[[0] * sizes[scope[2]] for _ in range(sizes[scope[1]])]
                    for _ in range(sizes[scope[0]])]
            for a, b, c, d in allowed:
                last[a][b][c] |= 1 << d
            supports = tuple(tuple(map(tuple, plane)) for plane in last)
        return cls(scope, frozenset(allowed), reasons.__getitem__, tag, supports)

    def revise(self, domains: list[int]) -> tuple[int, ...]:
        """The domains of the scope's variables that some allowed tuple
        supports, given ``domains``."""
        if len(self.scope) == 2:
            u, v = self.scope
            dv = domains[v]
            new_u = new_v = 0
            for a in bits(domains[u]):
                found = self.supports[a] & dv
                if found:
                    new_u |= 1 << a
                    new_v |= found
            return new_u, new_v
        if len(self.scope) == 3:
            u, v, w = self.scope
            dv, dw = domains[v], domains[w]
            new_u = new_v = new_w = 0
            for a in bits(domains[u]):
                row = self.supports[a]
                for b in bits(dv):
                    found = row[b] & dw
                    if found:
                        new_u |= 1 << a
                        new_v |= 1 << b
                        new_w |= found
            return new_u, new_v, new_w
        if len(self.scope) == 4:
            u, v, w, x = self.scope
            dv, dw, dx = domains[v], domains[w], domains[x]
            new = [0, 0, 0, 0]
            for a in bits(domains[u]):
                plane = self.supports[a]
                for b in bits(dv):
                    row = plane[b]
                    for c in bits(dw):
                        found = row[c] & dx
                        if found:
                            new[0] |= 1 << a
                            new[1] |= 1 << b
                            new[2] |= 1 << c
                            new[3] |= found
            return tuple(new)
        found = [0] * len(self.scope)
        for values in self.allowed:
            if all(domains[v] >> value & 1 for v, value in zip(self.scope, values)):
                for i, value in enumerate(values):
                    found[i] |= 1 << value
        return tuple(found)

    def forbidden_reason(self, domains: list[int], variable: int, value: int) -> str:
        """The reason of the first forbidden tuple with ``variable`` at
        ``value`` among those ``domains`` leave."""
        choices = [(value,) if v == variable else tuple(bits(domains[v])) or (0,)
                   for v in self.scope]
        for values in itertools.product(*choices):
            if values not in self.allowed:
                return self.reason(values)
        return ""


class Contradiction(Exception):
    """No assignment meets the rules: ``reasons`` says why, the rule that
    emptied a domain first, then those whose removals it rested on."""

    def __init__(self, reasons: tuple[tuple[str, str], ...]):
        super().__init__("; ".join(reason for _, reason in reasons))
        self.reasons = reasons  # (tag, reason)

    @property
    def tags(self) -> set[str]:
        return {tag for tag, _ in self.reasons}


class Network:
    """Variables of ``sizes[i]`` values each under ``tables``."""

    def __init__(self, sizes: Sequence[int], tables: Sequence[Table]):
        self.sizes = tuple(sizes)
        self.tables = tuple(tables)
        self.watching: list[list[int]] = [[] for _ in sizes]
        for index, table in enumerate(self.tables):
            for v in table.scope:
                self.watching[v].append(index)
        self.full = [(1 << size) - 1 for size in self.sizes]

    def propagate(self, domains: list[int], changed: Sequence[int] | None = None,
                  explain: bool = False) -> list[int]:
        """``domains`` narrowed to arc consistency (a new list), revising the
        rules that watch ``changed`` variables (all rules for None) and
        those their removals wake; raises :class:`Contradiction`."""
        domains = list(domains)
        tables, watching = self.tables, self.watching
        if changed is None:
            queue = deque(range(len(tables)))
        else:
            queue = deque(sorted({t for v in changed for t in watching[v]}))
        queued = set(queue)
        removed: dict[int, list[tuple[int, int, str]]] = {}  # variable -> (table, value, reason)
        while queue:
            index = queue.popleft()
            queued.discard(index)
            table = tables[index]
            narrowed = table.revise(domains)
            for v, mask in zip(table.scope, narrowed):
                if mask == domains[v]:
                    continue
                if explain:
                    for value in bits(domains[v] & ~mask):
                        removed.setdefault(v, []).append(
                            (index, value, table.forbidden_reason(domains, v, value)))
                if not mask:
                    raise Contradiction(self._explanation(table, v, domains, removed)
                                        if explain else ())
                domains[v] = mask
                for other in watching[v]:
                    if other != index and other not in queued:
                        queued.add(other)
                        queue.append(other)
        return domains

    def _explanation(self, table: Table, emptied: int, domains: list[int], removed) -> tuple:
        """The reasons of a contradiction: the rule's own, then, variable by
        variable back through its scope, the removals it rested on."""
        reasons: list[tuple[str, str]] = []
        for value in bits(domains[emptied]):
            reasons.append((table.tag, table.forbidden_reason(domains, emptied, value)))
        seen, stack = {emptied}, [v for v in table.scope if v != emptied]
        while stack:
            v = stack.pop(0)
            if v in seen:
                continue
            seen.add(v)
            for index, _, reason in removed.get(v, ()):
                reasons.append((self.tables[index].tag, reason))
                stack.extend(u for u in self.tables[index].scope if u not in seen)
        return tuple(dict.fromkeys(reasons))

    def fix(self, domains: list[int], assignment: dict[int, int], explain: bool = False):
        """``domains`` with each variable of ``assignment`` at its value, propagated."""
        domains = list(domains)
        for v, value in assignment.items():
            if not domains[v] >> value & 1:
                raise Contradiction((("", f"value {value} of variable {v} is already ruled out"),))
            domains[v] = 1 << value
        return self.propagate(domains, list(assignment), explain)

    def complete(self, domains: list[int], order: Sequence[int],
                 choose: Callable[[int, list[int]], list[int]]) -> list[int] | None:
        """A full assignment (every domain one value) within ``domains``,
        taking variables in ``order`` and their values in the order
        ``choose(variable, domains)`` gives, backtracking where propagation
        fails; None when there is none."""
        for position, v in enumerate(order):
            if domains[v] & (domains[v] - 1) == 0:
                continue
            for value in choose(v, domains):
                try:
                    narrowed = self.fix(domains, {v: value})
                except Contradiction:
                    continue
                rest = self.complete(narrowed, order[position + 1:], choose)
                if rest is not None:
                    return rest
            return None
        return domains
