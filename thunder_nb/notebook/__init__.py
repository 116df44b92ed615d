"""The notebook front end behind the magic: `compare` (eager, then each version on its own copies, checked and
timed), the original/fixed widget, and notebooks exported as standalone pages."""
