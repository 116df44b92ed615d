"""Python's and NumPy's random number generators refused in traced code, whose draws thunder would fix at the first
call: one change to the lookaside function of thunder's interpreter (``thunder.core.jit_ext.general_jit_lookaside``,
lightning-thunder 0.2.6), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`).

thunder's interpreter runs a call it has no rule for once, while it traces, and its trace keeps the value as a
constant: ``if self.training and random.random() < self.p: return x`` (a stochastic depth layer) took the branch of
the first call's draw at every call, silently, and ``np.random.rand()`` noise was the same noise every step. `install`
makes such a call, a method of a ``random.Random`` (the ``random`` module's functions are its methods), a NumPy
``RandomState`` (``np.random.rand`` and the module's other functions) or a NumPy ``Generator``, raise
``NotImplementedError`` with `REFUSAL`, which `thunder_nb.diagnosis.failures.LIMITS` ("python-random") answers with
what to write instead: torch's random ops, which thunder traces and draws anew at every call.
"""

from __future__ import annotations

import types
from typing import Any

from .patches import attribute_patch

__all__ = ["install", "uninstall", "installed", "REFUSAL"]

#: What a traced call of Python's or NumPy's random number generators raises.
REFUSAL = ("{name}() draws a Python random number, which thunder would draw once, while it traces, and keep for every "
           "later call")


#: The methods of Python's generator that draw (every other draw of the ``random`` module's goes through them).
_PYTHON_DRAWS = frozenset({"random", "getrandbits", "randbytes"})
#: The public methods of NumPy's generators that draw nothing.
_NUMPY_NOT_DRAWS = frozenset({"seed", "get_state", "set_state", "bit_generator", "spawn"})


def _draws(owner: Any, name: str, kinds: tuple[type, ...]) -> bool:
    """Whether ``owner.name(...)`` draws from Python's generator (``kinds[0]``) or NumPy's (the others)."""
    if isinstance(owner, kinds[0]):
        return name in _PYTHON_DRAWS
    return isinstance(owner, kinds[1:]) and not name.startswith("_") and name not in _NUMPY_NOT_DRAWS


def _generator_types() -> tuple[type, ...]:
    """The classes whose methods draw from Python's or NumPy's generators (``random.Random``'s C base, NumPy's)."""
    import _random

    kinds: list[type] = [_random.Random]
    try:
        import numpy.random
    except ImportError:  # NOTE: no NumPy installed: its generators cannot be called either
        return tuple(kinds)
    kinds += [numpy.random.RandomState, numpy.random.Generator]
    return tuple(kinds)


def _refusing(original: Any, kinds: tuple[type, ...]) -> Any:
    """thunder's lookaside function, which gives a call of a method of ``kinds`` a lookaside raising `REFUSAL`."""
    from thunder.core import jit_ext
    from thunder.core.interpreter import unwrap

    def general_jit_lookaside(fn: Any, *args: Any, **kwargs: Any) -> Any:
        # NOTE: a bound method (random.random) or, as the interpreter calls a builtin or Cython method, the class's
        # function with the instance first (_random.Random.random, RandomState.rand for np.random.rand)
        owner = getattr(fn, "__self__", None)
        if owner is None and args and not isinstance(fn, types.FunctionType):
            owner = unwrap(args[0])
        if owner is not None and _draws(owner, getattr(fn, "__name__", ""), kinds):
            name = f"{'random' if isinstance(owner, kinds[0]) else 'numpy.random'}.{fn.__name__}"

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError(REFUSAL.format(name=name))

            return jit_ext.interpreter_needs_wrap(refuse)
        return original(fn, *args, **kwargs)

    return general_jit_lookaside


def _jit_ext() -> Any:
    from thunder.core import jit_ext

    return jit_ext


#: thunder's lookaside function changed as this module's docstring says, once per process
_patch = attribute_patch(_jit_ext, "general_jit_lookaside",
                         lambda original: _refusing(original, _generator_types()),
                         expected=lambda f: getattr(f, "__module__", None) == "thunder.core.jit_ext"
                         and hasattr(_jit_ext(), "interpreter_needs_wrap"))
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
