"""What the checks need to know of a model, as a value without torch: its flat vector's entries, its linear and
normalization layers, whether it has a projection head, and what one training sample's forward pass gave.

A rank measures it once from the built model (`FlatModel.describe`); fedmpi.run.resolve judges a config
against it (and `--dry-run` the same way), so every check of a model is pure and no check needs the model
itself. `output` and `forward_error` record the probe's outcome; whether they fit the data is the resolve
step's verdict (`takes_problems`), not the probe's."""

from __future__ import annotations

from dataclasses import dataclass

# The zoo's model names (fedmpi.core.models.BUILDERS builds them; a test holds the two equal), here so that
# checking model.name does not import torch.
ZOO_MODELS = ("lr", "mlp", "cnn_mnist", "cnn2", "simple_cnn", "lstm", "resnet18", "pfl_cnn", "causal_lm")


@dataclass(frozen=True)
class ModelShape:
    dim: int                        # entries of the flat vector (parameters, then float buffers)
    n_params: int                   # its trainable entries
    entries: tuple = ()             # (name, offset, numel) of each parameter and float buffer, in vector order
    linear_layers: tuple = ()       # module names of the nn.Linear layers, in named_modules order
    norm_layers: tuple = ()         # module names of the normalization layers (BatchNorm, GroupNorm, LayerNorm)
    forward_rep: bool = False       # a projection head (`forward_rep`, MOON's representation)
    output: tuple | None = None     # the output shape of one training sample (None: not probed, no samples)
    forward_error: str = ""         # the first line of what that forward pass raised ("" when it ran)
    sample: str = ""                # that sample's shape and dtype, for the messages
    unbatchable: str = ""           # why its clients cannot train as one batched group ("" when they can)


def takes_problems(shape: ModelShape, model_name, data_name, num_classes) -> list:
    """Why the model does not take the data set's inputs (empty: it does): one training sample through a
    forward pass must give [1, num_classes] outputs, so that a model that cannot take the data (an lstm on
    images or on synthetic features) is refused at set-up and never fails in round 0."""
    if shape.forward_error:
        return [f"model.name = {model_name!r} cannot take data.name = {data_name!r}'s inputs (one sample of "
                f"{shape.sample}): {shape.forward_error}; choose a model for this data (lstm and causal_lm take "
                f"shakespeare's "
                f"token sequences; lr, mlp and the CNNs float features or images)"]
    if shape.output is not None and tuple(shape.output) != (1, num_classes):
        return [f"model.name = {model_name!r} on data.name = {data_name!r}: one sample gives outputs of shape "
                f"{tuple(shape.output)}, not (1, {num_classes}) for its {num_classes} classes"]
    return []
