"""The single-machine backend: ``autorl run`` drives a whole experiment with local processes."""
