"""The engine: scheduling, continuous batching with chunked prefill, and the model runner.

``queue`` writes the interface every scheduler queue offers.
"""
