"""Client-level differential privacy (docs/how-to/privacy.md).

keys        the `privacy:` config section (PrivacyConfig)
mechanism   clipping, the (seed, round) noise, DP-FedAvg's average, Poisson sampling, adaptive clipping
accounting  epsilon from Google's dp-accounting (optional extra `fedmpi[privacy]`), noise for a target
plan        config + cohort -> the run's noise multipliers and epsilon; cross-section checks
"""
