"""Upload stages: what happens to a client's update between training and the reduction (compression,
differential privacy). This package holds the base (`UploadStage`) and the buffer layout; the stages are in
fedmpi.deploy and fedmpi.privacy, and the factory that picks them is in `fedmpi.round.providers`."""
