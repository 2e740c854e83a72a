"""Participation: who trains in a round and whose update counts (`RoundPlan`, `Participation`). This package
holds the base and the standard draw; the providers of deployment realism (fedmpi.deploy) and of Poisson
sampling (fedmpi.privacy) build on it, and the factory that picks one is in `fedmpi.round.providers`."""
