"""One module per kopf event; ``operator.main`` registers them."""
