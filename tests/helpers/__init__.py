"""Plain helper functions the test modules share (fixtures live in the conftest.py files).

    trace_checks   trace.json of a real run: nesting, names, the engines' request slices
    task_shapes    users' data files and reward functions for the task-shapes tier
    models         a random tiny Qwen2 written to disk (rollout and weight-sync tests)
    batches        random trajectories and TrainBatches for trainer-worker tests
    runs           build a recipe from a preset, read a run directory's metrics, spy on steps

Import them as ``from tests.helpers.<module> import ...``: pytest puts the repository root on
``sys.path`` (``pythonpath`` in pyproject.toml), and nothing else is imported by its basename.
"""
