"""``capture``'s one vocabulary (`thunder_nb.cudagraph.capture`): each spelling parsed to one `Capture` at each entry
point (the magic, `jit`, `jit_step`, the transforms, `compare`), anything else refused with the one message, and
"capture=True without CUDA" said in one place."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

import thunder_nb
from thunder_nb.cudagraph.capture import Capture, CUDAUnavailableError, parse_capture, resolve
from thunder_nb.fix import FixedCUDAGraphTransform, LegacyCUDAGraphTransform

#: Every public spelling and the member it stands for.
SPELLINGS = [(True, Capture.CUDA), (False, Capture.OFF), ("auto", Capture.AUTO), ("on", Capture.CUDA),
             ("off", Capture.OFF), ("emulated", Capture.EMULATED), *((c, c) for c in Capture)]
#: Values that look close and are refused.
REFUSED = ["yes", "cuda", "AUTO", "", None, 1, 0, 1.0]
#: The one message that refuses them.
ONE_MESSAGE = (r"^capture must be one of 'auto', True \('on'\), False \('off'\) or 'emulated' \(the CPU stand-in\), "
               r"not ")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")


@pytest.mark.parametrize("value, member", SPELLINGS, ids=repr)
def test_parse_takes_each_spelling(value, member):
    assert parse_capture(value) is member


@pytest.mark.parametrize("value", REFUSED, ids=repr)
def test_parse_refuses_the_rest_with_one_message(value):
    with pytest.raises(ValueError, match=ONE_MESSAGE + re.escape(repr(value)) + "$"):
        parse_capture(value)


def test_resolve_decides_auto_by_the_device_and_refuses_cuda_without_one():
    assert resolve(Capture.AUTO, "cuda") is Capture.CUDA
    assert resolve(Capture.AUTO, "cpu") is Capture.OFF
    assert resolve(Capture.AUTO, torch.device("cpu"), auto=Capture.EMULATED) is Capture.EMULATED
    assert resolve(Capture.AUTO, None, auto=Capture.EMULATED) is Capture.EMULATED
    assert resolve(Capture.CUDA, torch.device("cuda", 0)) is Capture.CUDA
    assert resolve(Capture.OFF, "cuda") is Capture.OFF and resolve(Capture.EMULATED, "cuda") is Capture.EMULATED
    with pytest.raises(CUDAUnavailableError, match=r"^capture=True needs a CUDA GPU, and torch sees none \(capture "
                                                   r"'auto' runs the regions eagerly\)$"):
        resolve(Capture.CUDA, None)
    # NOTE: a RuntimeError where the transforms raised one, a ValueError where jit_step did
    with pytest.raises(RuntimeError, match=r"^capture=True needs the model on a CUDA device, not on cpu \(capture "
                                           r"'auto' runs capture's CPU stand-in\)$"):
        resolve(Capture.CUDA, torch.device("cpu"), what="the model", auto=Capture.EMULATED)


# --- at each entry point --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [FixedCUDAGraphTransform, LegacyCUDAGraphTransform])
def test_the_transforms_parse_once_and_keep_the_member(cls):
    for value, member in SPELLINGS:
        if member in (Capture.AUTO, Capture.OFF):
            t = cls(capture=value)
            assert t.capture is member and t.cuda_graph_runner.capture is member
    for value in REFUSED:
        with pytest.raises(ValueError, match=ONE_MESSAGE):
            cls(capture=value)
    with pytest.raises(ValueError, match=r"^thunder_nb.jit \(and each transform\) takes capture 'auto', True "
                                         r"\('on'\) or False \('off'\), not 'emulated'"):
        cls(capture="emulated")


def test_jit_parses_once_and_keeps_the_member():
    from thunder_nb import internals

    for value, member in SPELLINGS:
        if member in (Capture.AUTO, Capture.OFF):
            assert internals.jit_transforms(thunder_nb.jit(torch.sin, capture=value))[0].capture is member
    with pytest.raises(ValueError, match=ONE_MESSAGE + "'yes'$"):
        thunder_nb.jit(torch.sin, capture="yes")


@NO_GPU
@pytest.mark.parametrize("value", [True, "on", Capture.CUDA], ids=repr)
def test_cuda_without_a_gpu_is_the_one_message_at_jit_and_the_transforms(value):
    for make in (lambda: thunder_nb.jit(torch.sin, capture=value), lambda: FixedCUDAGraphTransform(capture=value),
                 lambda: LegacyCUDAGraphTransform(capture=value)):
        with pytest.raises(RuntimeError, match=r"^capture=True needs a CUDA GPU, and torch sees none"):
            make()


def test_the_runner_takes_each_spelling_when_set():
    runner = FixedCUDAGraphTransform(capture=False).cuda_graph_runner
    for value, member in SPELLINGS:
        runner.capture = value
        assert runner.capture is member
    with pytest.raises(ValueError, match=ONE_MESSAGE):
        runner.capture = "yes"


def _step(capture):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return thunder_nb.jit_step(model, lambda x: model(x).square().mean(), torch.optim.SGD(model.parameters(), lr=0.1),
                               capture=capture)


def test_jit_step_parses_once_and_resolves_by_the_device():
    words = {Capture.AUTO: "emulated on the CPU", Capture.EMULATED: "emulated on the CPU", Capture.OFF: "uncaptured"}
    for value, member in SPELLINGS:
        if member is not Capture.CUDA:
            assert words[member] in repr(_step(value)), value
    for value in REFUSED:
        with pytest.raises(ValueError, match=ONE_MESSAGE):
            _step(value)
    for value in (True, "on", Capture.CUDA):
        with pytest.raises(ValueError, match=r"^capture=True needs the model on a CUDA device, not on cpu"):
            _step(value)


def test_compare_parses_once_and_refuses_the_stand_in():
    for value in REFUSED:
        with pytest.raises(ValueError, match=ONE_MESSAGE):
            thunder_nb.compare(torch.sin, (torch.ones(2),), capture=value)
    with pytest.raises(ValueError, match=r"^compare takes capture 'auto', True \('on'\) or False \('off'\), not "
                                         r"'emulated'"):
        thunder_nb.compare(torch.sin, (torch.ones(2),), capture="emulated")


def test_compare_step_refuses_off():
    from thunder_nb.step import compare_step

    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=r"^compare_step \(it runs the step captured\) takes capture 'auto', True "
                                         r"\('on'\) or 'emulated' \(the CPU stand-in\), not False \('off'\)$"):
        compare_step(model, lambda x: model(x).sum(), torch.optim.SGD(model.parameters(), lr=0.1), torch.ones(1, 4),
                     capture="off")


def _magic_args(line: str):
    from thunder_nb.magics import ThunderCUDAGraphMagics
    from thunder_nb.notebook import magic_line

    args = parse_argstring(ThunderCUDAGraphMagics.thunder_cudagraph, line)
    magic_line.check_arguments(args)
    return args


def test_the_magic_parses_its_words_once():
    for word, member in (("auto", Capture.AUTO), ("on", Capture.CUDA), ("off", Capture.OFF)):
        assert _magic_args(f"--capture {word}").capture is member
    assert _magic_args("").capture is Capture.AUTO
    with pytest.raises(UsageError):  # NOTE: argparse takes only the words its help and the README's table show
        _magic_args("--capture yes")


def test_the_magic_whole_step_refuses_off_and_cuda_without_a_gpu():
    from thunder_nb.notebook import magic_line

    with pytest.raises(UsageError, match=r"^--whole-step records the step as one graph: not with --capture off"):
        magic_line.check_whole_step(_magic_args("--whole-step model,opt --capture off"))
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match=r"^--whole-step: capture=True needs a CUDA GPU, and torch sees none"):
            magic_line.check_whole_step(_magic_args("--whole-step model,opt --capture on"))


# --- said once ------------------------------------------------------------------------------------


@pytest.mark.parametrize("phrase", [r"capture must be one of", r"capture=True needs", r"CUDA GPU, and torch sees none",
                                    r"on a CUDA device, not on"])
def test_each_capture_message_is_written_once(phrase):
    """The refusals of ``capture`` are worded in `thunder_nb.cudagraph.capture` alone."""
    root = pathlib.Path(thunder_nb.__file__).parent
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if re.search(phrase, p.read_text()))
    assert found == ["cudagraph/capture.py"], found
