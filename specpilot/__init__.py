"""SpecPilot: find, verify and ship the fastest lossless speculative-decoding engine."""

__version__ = "0.1.0"
