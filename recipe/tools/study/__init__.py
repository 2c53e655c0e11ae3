"""Learning studies: grids of real training runs whose results answer a question users ask
before they trust an async recipe (``python -m recipe.tools.study.<name>``).

staleness.py  how final accuracy holds as ``async_training.staleness_threshold`` grows, per
              off-policy correction, over seeds (runs, resumable)
table.py      the study's aggregation: the printed table, results.json and the plot
modes.py      the same task in several modes: time to sync's final accuracy (runs, resumable)
accuracy.py   that study's records, table and accuracy plot
runs.py       one run of a study in a subprocess, logged, under a deadline
lengths.py    before a study: the response-length histogram of a workload per level (the run's
              config, prompts, engine and reward); length_stats.py its statistics and table
tool_use.py   before a tool-use study: whether a model calls the python tool of
              ``env=math_python`` (its first turns sampled and counted)
graders.py    our MATH grader against math-verify, on responses and on the reference answers
judge_agreement.py  how often the LLM judge (``reward.judge``) agrees with the rule scorer on
              a sample of lengths.py's responses; agreement.py its statistics, judge_engine.py
              the judge model's engine in the tool's process
"""
