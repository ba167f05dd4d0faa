"""The Kubernetes operator: ``Experiment`` objects become Jobs, a Secret and a NetworkPolicy."""
