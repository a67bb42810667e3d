"""Mutation testing of the project's own kernels: a measure nobody hand-picks.

The hand-written mutants (:mod:`c128a.mutants`) measure the faults their
authors thought of. Here every kernel function of a subject
(:mod:`c128a.kernels.adaptive`, :mod:`c128a.kernels.baseline`) is mutated
one expression at a time (:mod:`.mutator`: operators, comparisons,
constants, masks, as mutmut and cosmic-ray make them), each mutant is loaded
as a target and judged by the conformance properties in a child process of
its own (:mod:`.subjects` says which, :mod:`.child` runs them,
:mod:`.scheduler` runs the children with time limits), and
:mod:`.report` gives the score, the survivors, the equivalents, the timeouts
and crashes. The mutants known to survive are listed with why
(:mod:`.known`, ``known_mutants.txt``), strictly. ``c128a mutate`` runs it.
"""

from .known import DEFAULT_KNOWN, EQUIVALENT, SURVIVES, KnownMutant, read_known
from .mutator import KINDS, Mutant, mutants_of
from .report import Result, Verdict, json_report, text_report
from .scheduler import MutationConfig, MutationRun
from .subjects import KERNEL_SUBJECTS, LEFT_OUT, PRIMARY_PROPERTIES, Run, Subject, load_subject

__all__ = [
    "DEFAULT_KNOWN",
    "EQUIVALENT",
    "KERNEL_SUBJECTS",
    "KINDS",
    "KnownMutant",
    "LEFT_OUT",
    "MutationConfig",
    "MutationRun",
    "Mutant",
    "PRIMARY_PROPERTIES",
    "Result",
    "Run",
    "SURVIVES",
    "Subject",
    "Verdict",
    "json_report",
    "load_subject",
    "mutants_of",
    "read_known",
    "text_report",
]
