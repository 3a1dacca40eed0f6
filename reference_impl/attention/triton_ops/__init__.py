"""The Triton kernels: split-KV decode, two-stage and unified single-stage extend, and what they share."""
