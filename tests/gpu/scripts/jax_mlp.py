"""An unmodified JAX training script: a jitted MLP step (bf16 matmuls, Adam written out), default XLA flags, so
XLA compiles and autotunes on its own threads and runs the step as a CUDA graph (command buffers) once warm.
``python jax_mlp.py [STEPS] [--out FILE]``: prints the loss; with --out, saves the final parameters (.npy) so that
a profiled run can be compared with a plain one bit for bit."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np



def init(key, sizes=(512, 1024, 1024, 256)):
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        key, k = jax.random.split(key)
        params.append((jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a), jnp.zeros((b,), jnp.float32)))
    return params


def loss_fn(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = jnp.dot(h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)).astype(jnp.float32) + b
        if i < len(params) - 1:
            h = jax.nn.gelu(h)
    return jnp.mean((h - y) ** 2)


@jax.jit
def step(params, m, v, t, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    mhat = jax.tree_util.tree_map(lambda m: m / (1 - b1 ** t), m)
    vhat = jax.tree_util.tree_map(lambda v: v / (1 - b2 ** t), v)
    params = jax.tree_util.tree_map(lambda p, mh, vh: p - lr * mh / (jnp.sqrt(vh) + eps), params, mhat, vhat)
    return params, m, v, loss


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else 30
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    key = jax.random.PRNGKey(0)
    params = init(key)
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    x = jax.random.normal(jax.random.PRNGKey(1), (2048, 512), jnp.float32)
    y = jax.random.normal(jax.random.PRNGKey(2), (2048, 256), jnp.float32)
    t0 = time.perf_counter()
    for t in range(1, steps + 1):
        params, m, v, loss = step(params, m, v, jnp.float32(t), x, y)
    loss = float(loss)
    print(f"loss {loss:.6f} after {steps} steps in {time.perf_counter() - t0:.2f} s")
    if out:
        np.save(out, np.concatenate([np.asarray(a).ravel() for p in params for a in p]))


if __name__ == "__main__":
    main()
