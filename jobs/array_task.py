"""Entry point of one task of a job array submitted by `ArraySlurmExecutor`.

    python -m jobs.array_task FOLDER ARRAY_PICKLE

The array's submissions are in one pickle; this task takes its own (by
SLURM_ARRAY_TASK_ID), writes it where submitit expects a task's pickle, unless
a checkpoint already wrote one there, and hands over to submitit.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import cloudpickle
from submitit.core.submission import process_job
from submitit.core.utils import JobPaths

from rl.fsio import atomic_write


def main(folder: str, array_pickle: str) -> None:
    array_id, index = os.environ["SLURM_ARRAY_JOB_ID"], int(os.environ["SLURM_ARRAY_TASK_ID"])
    own = JobPaths(folder, f"{array_id}_{index}").submitted_pickle
    if not own.exists():  # first start; after a requeue it holds the checkpoint
        with open(array_pickle, "rb") as f:
            submissions = pickle.load(f)
        atomic_write(own, cloudpickle.dumps(submissions[index], pickle.HIGHEST_PROTOCOL))
    process_job(Path(folder))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
