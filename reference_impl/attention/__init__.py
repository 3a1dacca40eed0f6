"""Attention backends: their interface (``backend``), the torch reference, the Triton paged kernels, and the launch-geometry audit."""
