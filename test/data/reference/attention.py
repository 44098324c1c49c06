#!/usr/bin/python3
"""Independent reference values for transformer_layer and contrastive_loss.

Writes attention.json beside this script: inputs, parameters, the output
gradient, and the forward outputs and backward gradients computed here in
float64 with NumPy from the definitions in docs/spec/ops.md, never from the
C++ code. The gradients are central finite differences of the float64
forward (h = 1e-6, error about 1e-9), so the backward passes are checked
without a second hand derivation. test/exec/test_reference.cpp reads the
file; CI needs no NumPy. Regenerate (Debian's python3-numpy):

    /usr/bin/python3 test/data/reference/attention.py

Inputs and parameters are rounded to float32 before use, so the C++ side
starts from exactly the same numbers. Deterministic: the same file every
time with the same NumPy.
"""
import json
import os

import numpy as np

LN_EPS = 1e-5


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def layernorm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # population variance
    return (x - mean) / np.sqrt(var + LN_EPS) * g + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def transformer_layer(x, p, heads, causal):
    """Pre-LN layer: x1 = x + MHA(LN1(x)) W_o + b_o; y = x1 + GELU(LN2(x1) W_1 + b_1) W_2 + b_2."""
    b, s, h = x.shape
    dh = h // heads
    xn = layernorm(x, p["ln1_g"], p["ln1_b"])

    def split(t):  # [b, s, h] -> [b, heads, s, dh]: head j = columns j*dh .. (j+1)*dh - 1
        return t.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)

    q = split(xn @ p["w_q"] + p["b_q"])
    k = split(xn @ p["w_k"] + p["b_k"])
    v = split(xn @ p["w_v"] + p["b_v"])
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    if causal:  # query i sees keys 0..i
        scores = np.where(np.triu(np.ones((s, s), dtype=bool), 1), -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    attn = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
    x1 = x + attn @ p["w_o"] + p["b_o"]
    m = gelu_tanh(layernorm(x1, p["ln2_g"], p["ln2_b"]) @ p["w_1"] + p["b_1"])
    return x1 + m @ p["w_2"] + p["b_2"]


def contrastive_loss(a, b, temperature):
    """Symmetric InfoNCE on L2-normalised rows: 0.5 (CE(rows) + CE(columns)), means over the batch."""
    u = a.reshape(a.shape[0], -1)
    w = b.reshape(b.shape[0], -1)
    u = u / np.linalg.norm(u, axis=1, keepdims=True)
    w = w / np.linalg.norm(w, axis=1, keepdims=True)
    logits = u @ w.T / temperature

    def ce_diag(m):  # mean over rows of -log softmax(row)[i]
        mx = m.max(axis=1, keepdims=True)
        lse = np.log(np.exp(m - mx).sum(axis=1)) + mx[:, 0]
        return np.mean(lse - np.diag(m))

    return 0.5 * (ce_diag(logits) + ce_diag(logits.T))


def numeric_grad(f, x, h=1e-6):
    """d f / d x by central differences, f a float64 scalar function of x (changed in place, restored)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        x0 = flat[i]
        flat[i] = x0 + h
        fp = f()
        flat[i] = x0 - h
        fm = f()
        flat[i] = x0
        gflat[i] = (fp - fm) / (2 * h)
    return g


def tensor(a):
    a = np.asarray(a)
    return {"shape": list(a.shape), "values": [float(v) for v in a.reshape(-1)]}


def transformer_case(rng, batch, seq, hidden, heads, ffn, causal):
    shapes = {
        "ln1_g": (hidden,), "ln1_b": (hidden,),
        "w_q": (hidden, hidden), "b_q": (hidden,), "w_k": (hidden, hidden), "b_k": (hidden,),
        "w_v": (hidden, hidden), "b_v": (hidden,), "w_o": (hidden, hidden), "b_o": (hidden,),
        "ln2_g": (hidden,), "ln2_b": (hidden,),
        "w_1": (hidden, ffn), "b_1": (ffn,), "w_2": (ffn, hidden), "b_2": (hidden,),
    }
    p = {}
    for name, shape in shapes.items():
        if name.startswith("ln") and name.endswith("_g"):
            p[name] = f32(1.0 + 0.3 * rng.standard_normal(shape))
        elif name.startswith("w_"):
            p[name] = f32(rng.standard_normal(shape) / np.sqrt(shape[0]))
        else:
            p[name] = f32(0.2 * rng.standard_normal(shape))
    x = rng.standard_normal((batch, seq, hidden))
    x[1] *= 0.004  # rows of variance ~1.6e-5, where LayerNorm's epsilon (1e-5) matters
    x = f32(x)
    dy = f32(rng.standard_normal((batch, seq, hidden)))
    y = transformer_layer(x, p, heads, causal)
    objective = lambda: float(np.sum(transformer_layer(x, p, heads, causal) * dy))
    grads = {name: tensor(numeric_grad(objective, p[name])) for name in shapes}
    dx = numeric_grad(objective, x)
    return {
        "op": "transformer_layer",
        "dims": {"hidden": hidden, "heads": heads, "ffn": ffn, "causal": causal},
        "params": {name: tensor(v) for name, v in p.items()},
        "inputs": [tensor(x)],
        "grad_output": tensor(dy),
        "output": tensor(y),
        "input_grads": [tensor(dx)],
        "param_grads": grads,
    }


def contrastive_case(rng, batch, dim, temperature):
    a = f32(rng.standard_normal((batch, 1, dim)))
    b = f32(a + 0.5 * rng.standard_normal((batch, 1, dim)))  # related pairs: matches on the diagonal
    t = 0.07 if temperature is None else temperature
    dloss = 0.75  # the backward scales by dL/dloss
    loss = contrastive_loss(a, b, t)
    objective = lambda: dloss * contrastive_loss(a, b, t)
    da = numeric_grad(objective, a)
    db = numeric_grad(objective, b)
    dims = {"dim": dim}
    if temperature is not None:
        dims["temperature"] = temperature
    return {
        "op": "contrastive_loss",
        "dims": dims,
        "params": {},
        "inputs": [tensor(a), tensor(b)],
        "grad_output": tensor(np.array([dloss])),
        "output": tensor(np.array([loss])),
        "input_grads": [tensor(da), tensor(db)],
        "param_grads": {},
    }


def main():
    rng = np.random.default_rng(20250101)
    cases = [
        transformer_case(rng, batch=2, seq=6, hidden=12, heads=3, ffn=20, causal=False),
        transformer_case(rng, batch=2, seq=6, hidden=12, heads=3, ffn=20, causal=True),
        contrastive_case(rng, batch=5, dim=6, temperature=None),  # the default, 0.07
        contrastive_case(rng, batch=4, dim=3, temperature=0.5),
    ]
    out = {
        "format": "spindle-op-reference",
        "version": 1,
        "generator": "test/data/reference/attention.py",
        "numpy": np.__version__,
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
