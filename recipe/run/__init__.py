"""What a training run owns beside its workers: placement, checkpoints, run metrics.

placement.py      device, Ray start, the workers' environment, GPU sharing, role bundles
checkpointing.py  RunCheckpointer: save, resume, the step ledger, metrics rewind
metrics.py        sample metrics and response-clip checks shared by every mode
"""
