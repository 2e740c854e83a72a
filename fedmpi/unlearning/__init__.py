"""Federated unlearning: FedEraser's calibrated replay of a recorded run (`unlearning:`, fedmpi.unlearning.keys;
the calibration is fedmpi.unlearning.federaser)."""
