"""The tiny seeded model: attention and Mamba2 layers, the batch-invariant building blocks, and ForwardBatch."""
