"""The engine: the processes of a run (sampler, training worker), the collector that stores what
they say, device locks, sweeps. Imports torch only inside the training process."""
