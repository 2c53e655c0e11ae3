"""Commands that are not part of a training run; nothing in a run imports them.

    bench/     ``python -m recipe.tools.bench.*``: benchmarks that print side-by-side ratios
    plan/      ``python -m recipe.tools.plan``: the capacity planner and its simulation
    report/    ``python -m recipe.tools.report``: plots, Gantt chart and report.md of runs
    study/     ``python -m recipe.tools.study``: time-to-accuracy studies and their measurements
    prepare/   ``python -m recipe.tools.prepare``: published datasets -> verl parquet
    models.py  ``python -m recipe.tools.models``: list the model catalog, build a model ahead
               of a run (a run builds the one it names itself, ``recipe.models``)
    export.py  ``python -m recipe.tools.export``: a LoRA run's checkpoint as something to serve

They import the library (``recipe``, ``fully_async_policy``, ``one_step_off``) like any user
code; the library never imports them (``tests/unit/test_tools_boundary.py``), so a reader of
a run can skip this folder.
"""
