"""PM sampling (metrics over time): the sampler, its decode pipeline, evaluation workers, shared memory, many devices."""
