"""FedAvg (McMahan et al.): the base hooks are exactly its rule, x + eta_g * sum_i p_i Delta_i."""

from fedmpi.algorithms.base import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"
