"""`sarl chaos`: faults injected into a real run on the local Slurm
(rl.chaos.faults), and the invariants checked after it (rl.chaos.invariants);
rl.chaos.run ties them together."""
