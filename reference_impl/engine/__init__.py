"""The engine: scheduling, continuous batching with chunked prefill, and the model runner."""
