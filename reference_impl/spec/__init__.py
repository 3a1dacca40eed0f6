"""Speculative decoding: greedy verification and accept length, and the ngram, draft (EAGLE-like) and MTP proposers.

``proposer`` writes the interface every proposer offers (the hooks the engine calls whatever the spec level).
"""
