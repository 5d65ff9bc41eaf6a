"""Hydra base configs of inq-train, shipped in the package as ``inq.conf``."""
