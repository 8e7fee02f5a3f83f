"""Ray Tune integration: AdaptDLScheduler and AdaptDLTrainableCreator (work in progress)."""
