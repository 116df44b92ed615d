"""``capture``: one vocabulary wherever thunder-nb takes it (the transforms, `compare`, `jit_step`, the magic)."""

from __future__ import annotations

from typing import Any, Literal, Union

__all__ = ["Capture", "CAPTURE_WORDS", "capture_mode"]

#: ``"auto"``: capture CUDA graphs when the region computes on a CUDA device, else run regions eagerly; True: always
#: capture (needs a GPU); False: never capture, regions run as plain Python.
Capture = Union[Literal["auto"], bool]

#: The magic's words for the three values (``--capture auto|on|off``), and the values they stand for.
CAPTURE_WORDS: dict[str, Capture] = {"auto": "auto", "on": True, "off": False}


def capture_mode(value: Any) -> Capture:
    """``value`` as ``"auto"``, True or False (the magic's ``"on"`` and ``"off"`` accepted too).

    Raises:
        ValueError: anything else.
    """
    if value is True or value is False:
        return value
    if isinstance(value, str) and value in CAPTURE_WORDS:
        return CAPTURE_WORDS[value]
    raise ValueError(f"capture must be one of 'auto', True ('on') or False ('off'), not {value!r}")
