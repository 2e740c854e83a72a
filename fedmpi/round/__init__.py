"""The round engine: one round as one function over explicit parts (`fedmpi.round.engine`), the parts
themselves (clients, wire buffers, server, server optimizer, evaluation, instruments) and their assembly
into one experiment (`fedmpi.round.experiment`)."""
