"""The fleetflame collector: polls every worker's sampler and stores time-bucketed profiles."""
