"""Systems under test other than the in-process reference: their checkpoints and child programs."""
