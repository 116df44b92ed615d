"""The notebook front end behind the magic: `compare` (eager, then each version on its own copies, checked and
timed), the original/fixed widget, notebooks exported as standalone pages, and what the magic calls (its line
checked, its cell run, the result shown)."""
