"""Set-up of robust aggregation (server.aggregator) and the omniscient attacks: what a config may combine,
and the chunked gather's settings (fedmpi.round.robust_gather; norm_bound under the plain reduction is
the upload stage fedmpi.round.robust_stage).

Refused at set-up, exit 2, before any file is written: a robust aggregator or an omniscient attack with an
algorithm that does not declare `robust_aggregation` (its upload is not one vector averaged by weight),
with differential privacy (its noise is calibrated to a sum, not to a robust rule), with
eval.client_drift (the drift figures need the reduced sums); a rule that needs the server's update (fltrust)
without the server's set.
"""

from __future__ import annotations

from fedmpi.attacks import malicious_clients
from fedmpi.attacks.keys import OMNISCIENT_ATTACKS
from fedmpi.robust.catalog import build_rule
from fedmpi.robust.chunks import BYTES_PER_ENTRY, chunk_bounds, chunk_width, default_budget
from fedmpi.round.robust_checks import uses_gather
from fedmpi.round.robust_gather import GatherSettings


def gather_settings(num_clients, server_trainer=None, *, server, attack, seed, gather_bytes, client, client_rate):
    """What the chunked gather is configured with for this run, or None where the plain reduction serves. From
    the `server`, `attack` and `client` sections, the run's seed, runtime.gather_memory (`gather_bytes`, None:
    the machine's share) and eta_l under client.lr_schedule (`client_rate`, what FLTrust's server update uses)."""
    if not uses_gather(server.aggregator, attack.name):
        return None
    omniscient = attack.name in OMNISCIENT_ATTACKS
    return GatherSettings(
        rule=build_rule(server.aggregator, server.robust),
        budget=default_budget() if gather_bytes is None else gather_bytes,
        malicious=malicious_clients(attack, num_clients, seed),
        attack=attack if omniscient else None,
        server_trainer=server_trainer, client_cfg=client,
        client_lr=client_rate.at)


def dry_run_line(server, attack_name, gather_bytes, dim) -> str:
    """`--dry-run`'s line on the chunked gather (empty where the run does not use it): the chunks a full round
    of server.clients_per_round counted clients is cut into, and rank 0's bound for them (`gather_bytes`:
    runtime.gather_memory, None: the machine's share)."""
    if not uses_gather(server.aggregator, attack_name):
        return ""
    budget = default_budget() if gather_bytes is None else gather_bytes
    s = server.clients_per_round
    width = chunk_width(budget, s, dim)
    passes = build_rule(server.aggregator, server.robust).passes()
    return (f"robust aggregation: {server.aggregator} through the chunked gather, {passes} pass(es) (+1 for "
            f"min_max/min_sum) over {len(chunk_bounds(dim, width))} chunk(s) of {width} coordinates for {s} "
            f"clients; rank 0 holds {s * width * BYTES_PER_ENTRY / 1e6:.1f} MB for a chunk "
            f"(runtime.gather_memory {budget / 1e6:.0f} MB)")
