"""Cost model: hardware table, model spec, roofline of each step, calibration, gap ranking.

Import the pieces from their modules (`specpilot.costmodel.roofline`, ...); this package
imports nothing heavy so it loads with the standard library alone.
"""
