"""The parts of ``benchmarks/model_step.py``: the decoder it times, the timing loop, the service's
demand path that tunes the decoder's keys, the profile and the lookups' cost.

A package rather than modules beside the benchmarks: ``benchmarks/*.py`` are the benchmarks
themselves, each with its plot.
"""
