"""thunder's bytecode interpreter made to trace faster, with the same traces: four changes to
``thunder.core.interpreter`` (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`, which every entry point calls).

- **Each frame's instructions, kept.** thunder disassembles a code object every time it runs a frame of it
  (``tuple(dis.get_instructions(code))`` in ``_run_frame``): tens of thousands of times for one training step of a
  2-layer model, most of them the same few code objects (thunder's own lookasides, the model's methods). The
  interpreter module's ``dis`` becomes a copy (`_dis_keeping_instructions`) whose ``get_instructions`` keeps each
  code object's instructions: equal code objects (they compare by their bytecode, constants, names, line table and
  first line) have equal instructions, and an ``Instruction`` is an immutable named tuple.
- **No spinning for an exception's frame.** When an exception leaves an interpreted frame (a failed ``getattr`` under
  ``hasattr``, the ``StopIteration`` ending a loop), thunder makes a Python frame for its traceback in a new thread,
  so that the frame has no caller, and waits for it with ``while not result_container: pass``: the waiting thread
  holds the GIL until the interpreter's switch interval (5 ms) hands it over, every time. `_python_frame` makes the
  same frame the same way and waits on a lock, which lets the thread run at once.
- **One frame's source line, not the whole stack's.** Every trace starts with ``inspect.stack()[2]`` (thunder's
  ``InterpreterRuntimeCtx``, for the call site that ``record_history`` logs): a `FrameInfo` of every frame on the
  stack, each with its source line, which looks up the frame's module among all of ``sys.modules``, 10-20 ms under
  pytest or IPython, and thunder reads one of them. The interpreter module's ``inspect`` becomes a copy
  (`_inspect_reading_one_frame`) whose ``stack`` makes each frame's `FrameInfo` when it is read: the same entry.
- **A global read as the dict lookup it ends in.** For every ``LOAD_GLOBAL`` thunder's ``globals_lookup`` interprets
  ``(lambda d, k: d[k])(globals, name)`` (two interpreted frames: the lambda, and the ``obj.__getitem__(index)`` of
  its ``BINARY_SUBSCR``), and for a builtin such as ``len`` or ``isinstance`` a second one into the ``__builtins__``
  dict: about 1 ms a name, 84% of the frames interpreted for a nanoGPT step. For a plain ``dict`` that holds the
  name, that interpretation ends in thunder's lookaside for ``dict.__getitem__``, its ``MutMappingWrapperMethods``'
  ``__getitem__``, which hands out the dict's item wrapper (provenance: the subscript of the dict by the name).
  `_globals_lookup` calls that lookaside directly; any other case (a name not found, a dict subclass, a module as
  ``__builtins__``, no provenance tracking, a recorded history) goes thunder's way.

What each saves is measured in ``bench/tracing.py`` (its results in ``bench/results``). `uninstall` puts thunder's own
back (for the tests that compare the two).
"""

from __future__ import annotations

import dis
import inspect
import sys
import types
from collections.abc import Sequence
from typing import Any

from .patches import ProcessPatch

__all__ = ["install", "uninstall", "installed"]

#: the most code objects whose instructions are kept (a model's methods, thunder's lookasides: a few thousand)
_KEPT = 16384


def _dis_keeping_instructions() -> types.ModuleType:
    """A copy of the ``dis`` module whose ``get_instructions`` keeps each code object's instructions. (Every name is
    in the copy's own namespace: thunder reads ``dis.Instruction`` in an ``isinstance`` about a million times a trace,
    and a module ``__getattr__`` that forwarded it made tracing slower than without the copy.)"""
    kept: dict[types.CodeType, tuple[dis.Instruction, ...]] = {}

    def get_instructions(x: Any, **options: Any) -> Any:
        if options or not isinstance(x, types.CodeType):
            return dis.get_instructions(x, **options)
        instructions = kept.get(x)
        if instructions is None:
            if len(kept) >= _KEPT:
                kept.clear()
            instructions = kept[x] = tuple(dis.get_instructions(x))
        return iter(instructions)

    copy = types.ModuleType(dis.__name__, dis.__doc__)
    copy.__dict__.update(dis.__dict__)
    copy.get_instructions = get_instructions
    copy.kept = kept  # NOTE: for the tests
    return copy


class _OuterFrames(Sequence):
    """What ``inspect.stack(context)`` returns from ``frame`` outwards (``frame`` first), each `inspect.FrameInfo` made
    when it is read."""

    def __init__(self, frame: types.FrameType | None, context: int) -> None:
        self._frame, self._context = frame, context

    def _frames(self) -> list[types.FrameType]:
        frames, frame = [], self._frame
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        return frames

    def __len__(self) -> int:
        return len(self._frames())

    def __getitem__(self, i: Any) -> Any:
        if not isinstance(i, int) or i < 0:  # NOTE: a slice or a negative index: the whole stack, as inspect's
            return inspect.getouterframes(self._frame, self._context)[i]
        frame = self._frame
        for _ in range(i):
            if frame is None:
                break
            frame = frame.f_back
        if frame is None:
            raise IndexError("list index out of range")
        return _frame_info(frame, self._context)


def _frame_info(frame: types.FrameType, context: int) -> inspect.FrameInfo:
    """``inspect.getouterframes(frame, context)[0]`` without the frames further out."""
    info = inspect.getframeinfo(frame, context)
    positions = getattr(info, "positions", None)  # NOTE: Python 3.11 and later
    return inspect.FrameInfo(frame, *info, positions=positions) if positions is not None else inspect.FrameInfo(
        frame, *info)


def _inspect_reading_one_frame() -> types.ModuleType:
    """A copy of the ``inspect`` module whose ``stack`` is `_OuterFrames` of its caller's frame; every other name is
    ``inspect``'s own."""

    def stack(context: int = 1) -> Sequence[inspect.FrameInfo]:
        return _OuterFrames(sys._getframe(1), context)

    copy = types.ModuleType(inspect.__name__, inspect.__doc__)
    copy.__dict__.update(inspect.__dict__)
    copy.stack = stack
    return copy


def _python_frame(self: Any) -> types.FrameType:
    """A Python frame at this interpreted frame's current line, with no caller: thunder's
    ``InterpreterFrame.get_or_make_python_frame``, waiting on a lock instead of spinning."""
    import _thread

    assert self.positions is not None
    lineno = self.positions.lineno if self.positions.lineno is not None else self.code.co_firstlineno
    replace = {"co_filename": self.code.co_filename, "co_firstlineno": self.code.co_firstlineno,
               "co_name": self.code.co_name}
    if hasattr(self.code, "co_qualname"):  # NOTE: Python 3.11 and later
        replace["co_qualname"] = self.qualname
    # NOTE: as many empty lines as put the raise on the frame's current line, relative to its first line
    code = compile((lineno - self.code.co_firstlineno) * "\n" + "raise ValueError()", self.code.co_filename, "exec")
    made: list[types.FrameType] = []
    done = _thread.allocate_lock()
    done.acquire()

    def make() -> None:
        def fn() -> None:
            pass

        try:
            fn.__code__ = code.replace(**replace)
            try:
                fn()
            except ValueError as e:
                tb = e.__traceback__
                while tb.tb_next is not None:
                    tb = tb.tb_next
                made.append(tb.tb_frame)
        finally:
            done.release()

    # NOTE: in a thread of its own, as thunder does, so that the frame's f_back is not the code handling the error
    _thread.start_new_thread(make, ())
    done.acquire()
    if not made:
        raise RuntimeError(f"thunder-nb could not make a Python frame for {self.qualname} at line {lineno}")
    return made[0]


def _globals_lookup(original: Any) -> Any:
    """thunder's ``globals_lookup`` (``original``) with a name found in a plain dict read through thunder's lookaside
    for ``dict.__getitem__``, where thunder's own would interpret ``d[k]`` to reach it."""
    from thunder.core import interpreter

    wrapped_value, getitem, wrap_const = (interpreter.WrappedValue, interpreter.MutMappingWrapperMethods.__getitem__,
                                          interpreter.wrap_const)
    compile_ctx, runtime_ctx = interpreter.get_interpretercompilectx, interpreter.get_interpreterruntimectx

    def globals_lookup(globals_dict: Any, name: Any) -> Any:
        if (isinstance(globals_dict, wrapped_value) and type(globals_dict.value) is dict
                and isinstance(name, wrapped_value) and type(name.value) is str
                and getattr(compile_ctx(), "_with_provenance_tracking", False)
                and not getattr(runtime_ctx(), "_record_history", True)):
            if name.value in globals_dict.value:
                return getitem(globals_dict, name)
            if "__builtins__" in globals_dict.value:
                builtins = getitem(globals_dict, wrap_const("__builtins__"))
                if type(builtins.value) is dict and name.value in builtins.value:
                    return getitem(builtins, name)
        return original(globals_dict, name)

    globals_lookup.__wrapped__ = original
    return globals_lookup


def _reads_dicts_through_the_lookaside() -> bool:
    """Whether thunder's interpreter reads ``d[k]`` of a plain dict through ``MutMappingWrapperMethods.__getitem__``
    (the lookaside `_globals_lookup` calls), with no lookaside of the jit in front of it."""
    from thunder.core import interpreter, jit_ext

    lookasides = getattr(interpreter, "_default_provenance_tracking_lookaside_map", {})
    wrapper = getattr(interpreter, "MutMappingWrapperMethods", None)
    return (wrapper is not None and lookasides.get(dict.__getitem__) is wrapper.__getitem__
            and dict.__getitem__ not in getattr(jit_ext, "_general_jit_lookaside_map", {})
            and all(callable(getattr(interpreter, name, None))
                    for name in ("globals_lookup", "wrap_const", "get_interpretercompilectx",
                                 "get_interpreterruntimectx")))


def _apply() -> dict[str, Any] | None:
    """This module's four changes to thunder's interpreter; what they replaced (None: not the interpreter this was
    written for, unchanged)."""
    from thunder.core import interpreter

    frame_class = interpreter.InterpreterFrame
    if not (isinstance(getattr(interpreter, "dis", None), types.ModuleType)
            and isinstance(getattr(interpreter, "inspect", None), types.ModuleType)
            and callable(getattr(frame_class, "get_or_make_python_frame", None))
            and _reads_dicts_through_the_lookaside()):
        return None
    originals = {"dis": interpreter.dis, "inspect": interpreter.inspect,
                 "frame": frame_class.__dict__["get_or_make_python_frame"],
                 "globals_lookup": interpreter.globals_lookup}
    interpreter.dis = _dis_keeping_instructions()
    interpreter.inspect = _inspect_reading_one_frame()
    frame_class.get_or_make_python_frame = _python_frame
    interpreter.globals_lookup = _globals_lookup(interpreter.globals_lookup)
    return originals


def _restore(originals: dict[str, Any]) -> None:
    from thunder.core import interpreter

    interpreter.dis = originals["dis"]
    interpreter.inspect = originals["inspect"]
    interpreter.InterpreterFrame.get_or_make_python_frame = originals["frame"]
    interpreter.globals_lookup = originals["globals_lookup"]


#: thunder's interpreter changed as this module's docstring says, once per process (`thunder_nb.internals.patches`)
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
