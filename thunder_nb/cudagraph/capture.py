"""``capture``: one vocabulary wherever thunder-nb takes it (the transforms, `jit`, `compare`, `jit_step`, the magic).

Each entry point parses what the user wrote once (`parse_capture`) and passes a `Capture` inward; `resolve` decides
``AUTO`` by the device and refuses ``CUDA`` without one, with the one message (`CUDAUnavailableError`)."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["Capture", "CAPTURE_WORDS", "CUDAUnavailableError", "parse_capture", "resolve", "only"]


class Capture(str, enum.Enum):
    """How regions (or a whole training step) are captured.

    A ``str`` enum: ``Capture.EMULATED == "emulated"``, as the records that hold one were compared before."""

    #: capture real CUDA graphs where the computation is on a CUDA device; elsewhere the entry point's fallback
    #: (the transforms: regions run eagerly; `jit_step`: the CPU stand-in)
    AUTO = "auto"
    #: always capture real CUDA graphs (needs a GPU): ``True``, ``--capture on``
    CUDA = "cuda"
    #: capture's CPU stand-in: the capture path, each graph an `thunder_nb.testing.emulated_capture` recording
    #: (`jit_step`'s fallback without a GPU; the tests' third mode)
    EMULATED = "emulated"
    #: never capture: regions (or steps) run as plain Python: ``False``, ``--capture off``
    OFF = "off"


#: The magic's words (``--capture auto|on|off``), and the values they stand for.
CAPTURE_WORDS: dict[str, Capture] = {"auto": Capture.AUTO, "on": Capture.CUDA, "off": Capture.OFF}

#: Every word a user may write for ``capture`` (True and False are taken apart, by identity).
_WORDS: dict[str, Capture] = {**CAPTURE_WORDS, "emulated": Capture.EMULATED}

#: How the messages name each member, in the user's spellings.
_SPELLING = {Capture.AUTO: "'auto'", Capture.CUDA: "True ('on')", Capture.OFF: "False ('off')",
             Capture.EMULATED: "'emulated' (the CPU stand-in)"}


class CUDAUnavailableError(RuntimeError, ValueError):
    """``capture=True`` without a CUDA device to capture on (a RuntimeError where the transforms raised one, a
    ValueError where `jit_step` did)."""


def parse_capture(value: Any) -> Capture:
    """``value`` as a `Capture`: True, False, ``"auto"``, ``"on"``, ``"off"``, ``"emulated"`` or a `Capture`.

    Raises:
        ValueError: anything else.
    """
    if value is True:
        return Capture.CUDA
    if value is False:
        return Capture.OFF
    if isinstance(value, Capture):
        return value
    if isinstance(value, str) and value in _WORDS:
        return _WORDS[value]
    raise ValueError("capture must be one of " + ", ".join(_SPELLING[c] for c in (Capture.AUTO, Capture.CUDA))
                     + f", {_SPELLING[Capture.OFF]} or {_SPELLING[Capture.EMULATED]}, not {value!r}")


def only(capture: Capture, *allowed: Capture, who: str) -> Capture:
    """``capture`` if ``who`` takes it (one of ``allowed``).

    Raises:
        ValueError: another member, worded as the user spells them.
    """
    if capture not in allowed:
        words = [_SPELLING[c] for c in allowed]
        raise ValueError(f"{who} takes capture {', '.join(words[:-1])} or {words[-1]}, not {_SPELLING[capture]}")
    return capture


def resolve(capture: Capture, device: Any, *, what: str = "the computation", auto: Capture = Capture.OFF) -> Capture:
    """``capture`` as it runs where ``what`` computes: ``AUTO`` becomes CUDA on a CUDA device, else ``auto`` (OFF:
    regions run eagerly; EMULATED: the step's CPU stand-in); CUDA is refused elsewhere; the rest is kept.

    Args:
        device: where ``what`` computes (a ``torch.device`` or its type, ``"cuda"``), or None: torch sees no GPU.

    Raises:
        CUDAUnavailableError: CUDA without a CUDA device, in the one message.
    """
    on_cuda = device is not None and getattr(device, "type", device) == "cuda"
    if capture is Capture.AUTO:
        return Capture.CUDA if on_cuda else auto
    if capture is Capture.CUDA and not on_cuda:
        needs = "a CUDA GPU, and torch sees none" if device is None else f"{what} on a CUDA device, not on {device}"
        instead = "runs capture's CPU stand-in" if auto is Capture.EMULATED else "runs the regions eagerly"
        raise CUDAUnavailableError(f"capture=True needs {needs} (capture 'auto' {instead})")
    return capture
