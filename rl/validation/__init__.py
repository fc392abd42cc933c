"""The `validation` role: task validation as a job array, and the checks
that decide whether a task is fit to train on (`sarl tasks validate`)."""
