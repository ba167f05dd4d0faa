"""Fast batched decoding with a model's own transformers modules: greedy for evaluation, sampled for
rollouts. torch and transformers are imported inside functions."""
