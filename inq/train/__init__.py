"""The Hydra training app of inq: ``inq-train`` (see :mod:`inq.train.app`)."""
