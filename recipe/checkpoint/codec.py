"""Trajectories to and from plain JSON values, for checkpoints of in-flight work.

A checkpoint holds trajectories that exist nowhere else once the run dies: groups waiting in
the message queue or the release order, partial responses paused at a sync, the one-step-off
recipe's generated next batch. Every field round-trips exactly (JSON floats are written with
``repr``, so log-probs come back bit for bit). An episode's earlier segments
(``Trajectory.segments``) are nested objects: decoding rebuilds them; a checkpoint written
before segments existed decodes with none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from recipe.protocol import Trajectory, TrajectorySegment


def encode_trajectory(traj: Trajectory) -> dict[str, Any]:
    return dataclasses.asdict(traj)


def decode_trajectory(data: dict[str, Any]) -> Trajectory:
    segments = [TrajectorySegment(**s) for s in data.get("segments", [])]
    return Trajectory(**{**data, "segments": segments})


def encode_groups(groups: list[list[Trajectory]]) -> list[list[dict[str, Any]]]:
    return [[encode_trajectory(t) for t in group] for group in groups]


def decode_groups(data: list[list[dict[str, Any]]]) -> list[list[Trajectory]]:
    return [[decode_trajectory(t) for t in group] for group in data]
