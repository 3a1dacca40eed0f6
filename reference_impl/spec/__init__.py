"""Speculative decoding: greedy verification and accept length, and the ngram, draft (EAGLE-like) and MTP proposers."""
