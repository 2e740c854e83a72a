"""The client-to-server path of an upload, as stages between a client's training and its `accumulate`.

A stage may change the trained vector in place (an update compressed and decoded as the server would see
it, or clipped), the client's weight (`run.weight`) and the bytes its upload costs (`run.payload_bytes`),
and may keep per-client state that checkpoints save (under its own names). On the server it sees the
reduced sums before the server update and may change them and their total weight (noise, expected
cohort size). Stages apply to REDUCE algorithms. What a stage cannot serve is refused at set-up by the
stage's own `check`, with the values it reads (the precision's here; differential privacy's and secure
aggregation's, which read many sections, in their packages): the base has no config hook.
With no stage configured (the default) the path is exactly the algorithm's own.

Room on the wire, for stages that must tell the workers something or hear from the clients (both none by
default, so the broadcast and the reduction stay exactly the algorithm's):
  header_size  floats rank 0 appends to the round's broadcast header (`header()`), which every rank,
               rank 0 included, receives as float32 values before training (`receive(values)`): e.g. the
               adaptive clip of differential privacy, which only rank 0 can compute.
  up_scalars   float64 sums after the algorithm's upload sums in the round's one reduction: each counted
               client adds `scalars(run)`, and `server` finds the total at `sums[up_offset:]`.
`layout` gives every stage its offsets once, at set-up.
"""

from __future__ import annotations


class UploadStage:
    name = ""
    keeps_client_state = False    # per-client state (e.g. a compression residual): clients train on their host
    # The model update reaches the server by the stage's own collective (secure aggregation's integer sum): the
    # float reduction then leaves out the algorithm's first upload vector, which would only carry zeros.
    own_vector_transport = False
    header_size = 0     # broadcast header floats (see the module docstring)
    up_scalars = 0      # float64 sums in the reduction
    header_offset = 0   # where this stage's header values start among all stages' (set by `layout`)
    up_offset = 0       # where its sums start in the reduced upload vector (set by `layout`)

    def on_server(self):
        """Rank 0, once at set-up: work only the server needs (e.g. the privacy accountant's curve)."""

    def header(self) -> list:
        """Rank 0, at each round's broadcast: `header_size` floats for every rank."""
        return []

    def receive(self, values):
        """Every rank, after each round's broadcast: the `header_size` values rank 0 sent (float32)."""

    def round_plan(self, plan):
        """Every rank, after the round's broadcast: the round's RoundPlan (who trains, whose update counts)."""

    def collective(self, comm, plan, acc):
        """Every rank, after its clients trained and before the protocol's reduction of `acc` (this rank's
        accumulator): a stage's own collective, entered by every rank (secure aggregation's integer sum)."""

    def client(self, run, down, model):
        """Worker: the client's trained vector is in `model.vec`, its start point in `down`."""

    def scalars(self, run) -> list:
        """Worker, after the client's `accumulate`: its `up_scalars` contributions to this stage's sums."""
        return []

    def server(self, t, sums, weight) -> float:
        """Server: may change the reduced `sums` in place; returns the total weight to divide by."""
        return weight

    def round_metrics(self, t) -> dict:
        """Server, after round t's update: extra /metrics figures."""
        return {}

    def attrs(self) -> dict:
        """Server: attributes for run.h5 (written when the run starts or resumes)."""
        return {}

    def client_state(self, cid) -> dict:
        return {}

    def bind_client_state(self, store):
        """Keeps the stage's per-client state (if any) in the rank's ClientStateStore (fedmpi.algorithms.state)."""

    def load_client_state(self, cid, state: dict):
        pass

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict):
        pass


def layout(stages, algo_up_len) -> tuple:
    """Sets each stage's header and reduction offsets; returns (header floats, reduction sums) in all."""
    header = up = 0
    for stage in stages:
        stage.header_offset, stage.up_offset = header, algo_up_len + up
        header += stage.header_size
        up += stage.up_scalars
    return header, up
