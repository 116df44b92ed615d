"""The value comparer under its old import path: `thunder_nb.values` is the one module that compares values."""

# NOTE: kept only for thunder_nb.testing.fuzz (calls.py, oracle.py: `from ..values import first_difference`),
# which another branch owns; once those two lines import `thunder_nb.values`, this module goes
from ..values import NUMBER_ATOL, NUMBER_RTOL, ValueComparison, compare_values, first_difference

__all__ = ["ValueComparison", "compare_values", "first_difference", "NUMBER_RTOL", "NUMBER_ATOL"]
