"""Drafters: `ngram` (prompt/self lookup), `draft:DIR` (small model), `block:DIR` (DFlash-style)."""
