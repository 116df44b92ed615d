"""Run by every Python started with this folder on its ``PYTHONPATH`` (``tests/conftest.py`` puts it there for the
processes the tests start): inductor's ISA checks made once (`inductor_checks`)."""

import inductor_checks

inductor_checks.install()
