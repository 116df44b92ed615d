"""Differential fuzzing of CUDA-graph transforms: a program generator, a call protocol, the rule table and the
oracle."""

from .calls import FAILURE_KINDS, PROTOCOL, Call, CallLog, Difference, differences, execute
from .collectives import WRAPPERS, world_of_one
from .oracle import judge, region_sources
from .programs import Chooser, InputSpec, Program, RandomChooser, generate, programs
from .rules import (
    KNOWN_BUGS,
    SHOWING,
    KnownBug,
    Prediction,
    Showing,
    explaining_rules,
    kinds_of,
    known_by_values,
    observable_rules,
    predict,
    shows,
)
from .verdicts import FixedStats, ProgramOutcome, Verdict

__all__ = [
    "Chooser",
    "RandomChooser",
    "InputSpec",
    "Program",
    "generate",
    "programs",
    "Call",
    "PROTOCOL",
    "FAILURE_KINDS",
    "CallLog",
    "Difference",
    "execute",
    "differences",
    "WRAPPERS",
    "world_of_one",
    "Showing",
    "SHOWING",
    "shows",
    "kinds_of",
    "observable_rules",
    "explaining_rules",
    "Prediction",
    "predict",
    "KnownBug",
    "KNOWN_BUGS",
    "known_by_values",
    "judge",
    "ProgramOutcome",
    "Verdict",
    "FixedStats",
    "region_sources",
]
