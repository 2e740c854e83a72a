"""The algorithm contract: what an FL algorithm is, as far as the round loop is concerned.

An algorithm is a small class of hooks in the spirit of pfl-research's FedAvg. It does tensor arithmetic
only: no MPI, no files. It says what it is through declared capabilities (class attributes, checked when
it is registered, and on the instance at set-up), never through which methods it happens to override; the
round loop (`fedmpi.round`) owns all communication and calls the hooks below.

Construction: `create(keys, context)` -> `Algorithm(keys, context)`. `keys` is the algorithm's own frozen
`Keys` (the `algorithm:` section); `context` an `AlgorithmContext`: seed, num_clients, clients_per_round,
rounds, dim, n_params, `history` (`history.selected(t)`: round t's selected clients, from the participation
provider, the same on every rank), `client` (a `ClientTraining`: lr, batch_size, epochs, steps, momentum,
drop_last, lr_schedule; `context.client_lr(t)` is the round's eta_l) and `privacy_enabled`. Nothing else
of the config reaches an instance; `check(cfg, model)` sees the whole config before anything is built.

Declared capabilities (class attributes)
  name, Keys             `algorithm.name` and the frozen dataclass of its keys, beside the class (`@register`)
  protocol               how uploads travel, set by the family base: REDUCE (`Reduce`: one Reduce), ROUTE
                         (`SlotRouting`: model slots moved between ranks), GATHER (`GatedUploads`: masked Gatherv),
                         BUFFER (`BufferedUploads`: updates held until their simulated arrival, then one Reduce)
  keeps_client_state     clients keep vectors between rounds (`ClientVectors`): they train on their fixed host
  vectorizable           a round's clients may train as one batched computation: `client_start` only loads the
                         broadcast vector, no `grad_hook`/`step_hook`/`loss_fn` (neither on the class nor set
                         on the instance), `accumulate` reads only the trained vector
  uses_server_set        needs the server's own set on rank 0 (FSL's D0, data sharing's G) for `initial_model`
                         and `after_step`; a non-empty `server_set_hint` makes server_data.size > 0 a requirement
  shares_data            `clients` merges shared data into the clients' sets (logged under /partition/shared)
  uses_server_optimizer  `aggregate` returns an update that `server.optimizer` applies; False: x + update as is
  down_vectors, up_vectors, up_scalars
                         vectors per client in each direction (bytes are derived from them); extra float64
                         sums after the upload vectors in the same reduction
  client_columns         per-client figures the algorithm sets in `ClientRun.figures` (/clients/<name>)
  fixed_cohort_only      why `server.sampling: poisson` cannot run it ("" = it can; central SGD, SlotRouting)
  privacy_problems(keys, client_steps)   classmethod: why Gaussian noise on clipped updates does not make it
                         client-level DP with these keys ([] = it does; SCAFFOLD, FedSkip, central, SAFL's
                         gating and IDA fusion, FedNova under client.epochs)
  personal               fnmatch patterns over the model's parameter and buffer names (named_parameters(),
                         named_buffers()) whose entries each client keeps for itself (FedPer's head); the
                         classmethod `personal_patterns(keys, model)` returns them for given keys and model
                         (default: `personal`; FedPer reads its keys, FedBN finds the norm layers). The union with
                         the config's `model.personal` is `context.split` (see "Personal parameters" below)

Hooks, in the order of a round (rank 0 is the server; "host" is the rank that trains the client, rank 0 at -n 1)
  hook                                   when              rank    may touch
  prepare_model(keys, module)  classmethod  model built   every   the nn.Module, before FlatModel flattens it
                                                                   (freezes or adds buffers; default nothing)
  check(cfg, model)      classmethod     before any file   every   nothing: raises ConfigError
  clients(parts, server_idx)             set-up            every   returns the index sets clients train on
  setup(ctx)                             set-up            every   its own attributes (sizes, server set, probe)
  initial_model(x0, server_trainer)      set-up            0       returns x_0 (pretraining, warm-up)
  select(round, standard, sizes)         every round       every   pure: the clients that train
  schedule(cid, sizes, selected)         per client        host    pure: (batch, steps) or None
  down_payload(x, out)                   round start       0       writes `out`, the broadcast
  round_start(round, down)               round start       host    every rank hosting clients, after the
                                         (REDUCE, GATHER,          broadcast, before training: per-client
                                         BUFFER)                   state (SAFL's end-of-round mix; None: none)
  client_start(run, down, model)         per client        host    loads the start point; per-client state
                                                                   (then the round loads the client's
                                                                   personal entries, if any)
  grad_hook(params, grad)                each local step   host    the flat gradient, in place (None: none)
  step_hook(params)                      after each step   host    the flat parameters, in place, after the
                                                                   optimizer step (None: none)
  loss_fn(xb, yb)                        each local step   host    returns the loss (None: cross-entropy)
  local_training(run, down, model, local)  per client      host    replaces the one pass of local SGD (None:
                                         (after                    one pass with the three hooks above):
                                         client_start)             `local.train(steps=None, grad_hook=None,
                                                                   loss_fn=None, step_hook=None, lr=None,
                                                                   stream=0)` runs one pass from the model's
                                                                   current vector and returns (loss_sum,
                                                                   seen); stream 0 is the client's own
                                                                   (seed, CLIENT, t, cid), FedAvg's, stream
                                                                   j >= 1 draws from (seed, PERSONAL, t, cid,
                                                                   j); `local.loss()` is the current vector's
                                                                   mean training loss; `local.steps`,
                                                                   `local.epoch_steps` the schedule's and one
                                                                   epoch's steps. It returns the figures of
                                                                   the pass that counts as the client's
                                                                   training loss and leaves the upload in
                                                                   `model`; `run.steps` stays the schedule's
                                                                   steps (`local.steps`)
  accumulate(run, down, model, acc)      after training    host    adds the upload to `acc`, returns its
                                         (REDUCE)                  weight; per-client state
  aggregate(x, up_sum, weight_sum, t)    after reduction   0       returns the update (None: keep x); server state
  eval_start(run, down, model)           local evaluation  host    loads what client run.cid is evaluated with
                                         (eval.local_every)        on its local test split; `down` is the global
                                                                   model after the round's step (`dim` entries)
  after_step(x, t)                       after optimizer   0       returns the next x (FSL's server learning)
  round_metrics()                        end of round      0       returns extra /metrics figures
  server_state() / load_server_state(s)  checkpoints       0       `ServerVectors` attributes: saved without code
  client_state(cid) / load_client_state  checkpoints       host    `ClientVectors` attributes: likewise
`grad_hook`, `step_hook`, `loss_fn`, `local_training` and `round_start` may be methods or attributes set in
`__init__` (SCAFFOLD picks its correction there); a `vectorizable` class may have none of the first four, on
the class (refused at registration) or on the instance (refused at set-up by `verify_declarations`, exit 2).
The protocol families add their own hooks: `SlotRouting` (order, is_period_start, is_aggregation,
start_slot, finish_slot, take_slot, put_slot, slot_weights, accumulate_slots), `GatedUploads` (gate,
fusion_weight), `BufferedUploads` (hold, release); see their docstrings (fedmpi.algorithms.families).

Personal parameters. `context.split` (a fedmpi.core.personal.ParameterSplit, or None) names the
flat vector's personal entries. For a REDUCE algorithm with a split, the round loop itself (no algorithm
code needed): loads the client's own personal entries into the model right after `client_start` (a client
without any yet keeps those of the broadcast, which are x_0's: the server's copy of them never changes);
after training keeps the trained personal entries in `personal_state` (a `ClientVectors` the base class makes,
checkpointed and spilled like any other) and puts the broadcast's values back into them before the upload,
so every upload's personal entries carry no change and the client's own values never reach the wire. The
server update's personal entries are zeroed too (DP noise cannot drift them). The buffers keep their layout;
`bytes_up`/`bytes_down` count the shared entries only (`wire_dim` per vector). Clients with a split train on
their fixed host, one by one (never batched). `eval_start` defaults to the global model with the client's
personal entries. An algorithm that keeps a whole personal model (Ditto) declares its own `ClientVectors`
(and keeps_client_state) and overrides `eval_start` to load it.

Upload sums arrive as float64 (so the result does not depend on the number of ranks); the global model `x`
and the broadcast are float32. Vectors have `dim` elements (the flat model: `n_params` trainable entries,
then float buffers such as batch-norm statistics). The accumulator has `up_vectors * dim + up_scalars`
elements.

Where it lives: this module is the contract's one import path (algorithms, plug-ins, the round loop and the
tests import from here). The base class and the record of a client's run are in fedmpi.algorithms.hooks,
the four protocol families in fedmpi.algorithms.families (each built on `Algorithm`), and the context an
instance is made with in fedmpi.algorithms.context. The split falls between what every algorithm has (its
declarations and hooks) and how a family moves uploads, so that neither half outgrows a module.
"""

from __future__ import annotations

from fedmpi.algorithms.context import (
    AlgorithmContext,
    ClientTraining,
    ParticipationHistory,
    PlanHistory,
    SetupContext,
    StandardDraws,
)
from fedmpi.algorithms.families import BufferedUploads, GatedUploads, Reduce, SlotRouting, weighted_mean_update
from fedmpi.algorithms.hooks import (
    BUFFER,
    GATHER,
    PERSONAL_STATE,  # noqa: F401 - importable from here, where it was defined before the split
    REDUCE,
    ROUTE,
    TRAINING_HOOKS,
    Algorithm,
    AlgorithmKeys,
    ClientRun,
)

# The contract's names, the context's included (defined in fedmpi.algorithms.context, imported from here by
# plug-ins written before it moved).
__all__ = ["BUFFER", "GATHER", "REDUCE", "ROUTE", "TRAINING_HOOKS", "Algorithm", "AlgorithmContext", "AlgorithmKeys",
           "BufferedUploads", "ClientRun", "ClientTraining", "GatedUploads", "ParticipationHistory", "PlanHistory",
           "Reduce", "SetupContext", "SlotRouting", "StandardDraws", "weighted_mean_update"]
