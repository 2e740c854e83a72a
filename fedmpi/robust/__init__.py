"""Byzantine-robust aggregation: aggregators as pure functions over chunks of the clients' update
matrix, and the bookkeeping of which clients each kept."""
