"""What a run tells its user while it runs and after: metrics, the timeline, the console.

config.py      LoggerConfig (logger.*: backends, console cadence, wandb)
tracking.py    Tracker and MetricsAccumulator: one metrics record per step, reduced once
backends.py    console, metrics.jsonl, tensorboard, wandb behind one interface
trace.py       Tracer / RunTrace: every process's spans, merged into trace.json
trace_file.py  trace.json read and written (Chrome trace format)
progress.py    the console's progress bar
"""
