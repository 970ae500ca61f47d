#!/usr/bin/env python3
"""PyTorch + cuDNN baseline for ./bench: the same network and SGD-momentum step, data on the GPU.

Whole step: eager and one CUDA graph per step, FP32 and TF32, batch 64/128/512, printing us/step
and images/s as ./bench does. Per op (cross-check of ./bench's cuDNN/cuBLAS columns): conv
forward / input gradient / weight gradient through aten.convolution_backward, linear through
matmuls, ReLU and max-pool, each captured K times in a CUDA graph and replayed R times (median
and P95 per launch).

    python3 scripts/torch_baseline.py [--config configs/mnist.yaml] [--markdown FILE]

The network comes from the config's model section (PyYAML needed); without --config, and without
configs/mnist.yaml, the reference network is built in.
"""

import argparse
import os
import statistics
import sys

REFERENCE = {
    "input": (1, 28, 28),
    "layers": [
        ("conv2d", {"out_channels": 32, "kernel": 5, "padding": 2}),
        ("relu", {}),
        ("maxpool2d", {"kernel": 2}),
        ("conv2d", {"out_channels": 64, "kernel": 5, "padding": 2}),
        ("relu", {}),
        ("maxpool2d", {"kernel": 2}),
        ("flatten", {}),
        ("linear", {"out_features": 1024}),
        ("relu", {}),
        ("linear", {"out_features": 10}),
        ("softmax_cross_entropy", {}),
    ],
    "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": False,
                  "weight_decay": 0.0},
    "source": "built-in reference network (configs/mnist.yaml)",
}


def fail(msg):
    print(f"torch_baseline: error: {msg}", file=sys.stderr)
    sys.exit(1)


def pair(v, what):
    """An int or a two-element list, as the config allows for kernel/stride/padding."""
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return (v[0], v[1])
    fail(f"{what}: expected an integer or [h, w], got {v!r}")


def load_network(path):
    if path is None:
        if not os.path.exists("configs/mnist.yaml"):
            return REFERENCE
        path = "configs/mnist.yaml"
    try:
        import yaml
    except ImportError:
        fail(f"reading {path} needs PyYAML (pip install pyyaml), or leave out --config")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    model = (cfg or {}).get("model") or fail(f"{path}: no model section")
    inp = model.get("input") or fail(f"{path}: model.input is missing")
    layers = []
    for i, item in enumerate(model.get("layers") or []):
        if isinstance(item, str):
            layers.append((item, {}))
        elif isinstance(item, dict) and len(item) == 1:
            kind, params = next(iter(item.items()))
            layers.append((kind, dict(params or {})))
        else:
            fail(f"{path}: model.layers[{i}]: expected a name or a one-key map, got {item!r}")
    opt = dict(REFERENCE["optimizer"])
    opt.update(cfg.get("optimizer") or {})
    if opt.get("type", "sgd") != "sgd":
        print(f"torch_baseline: note: {path} uses {opt['type']}; the baseline times SGD "
              "momentum as the anchors do", file=sys.stderr)
    return {"input": (inp["channels"], inp["height"], inp["width"]), "layers": layers,
            "optimizer": opt, "source": path}


def build_model(torch, net):
    nn = torch.nn
    c, h, w = net["input"]
    shape = (c, h, w)
    mods = []
    for kind, p in net["layers"]:
        if kind == "conv2d":
            kh, kw = pair(p.get("kernel"), "conv2d.kernel")
            sh, sw = pair(p.get("stride", 1), "conv2d.stride")
            ph, pw = pair(p.get("padding", 0), "conv2d.padding")
            mods.append(nn.Conv2d(shape[0], p["out_channels"], (kh, kw), (sh, sw), (ph, pw),
                                  bias=p.get("bias", True)))
            shape = (p["out_channels"], (shape[1] + 2 * ph - kh) // sh + 1,
                     (shape[2] + 2 * pw - kw) // sw + 1)
        elif kind == "relu":
            mods.append(nn.ReLU())
        elif kind == "maxpool2d":
            kh, kw = pair(p.get("kernel"), "maxpool2d.kernel")
            sh, sw = pair(p.get("stride", [kh, kw]), "maxpool2d.stride")
            ph, pw = pair(p.get("padding", 0), "maxpool2d.padding")
            mods.append(nn.MaxPool2d((kh, kw), (sh, sw), (ph, pw)))
            shape = (shape[0], (shape[1] + 2 * ph - kh) // sh + 1,
                     (shape[2] + 2 * pw - kw) // sw + 1)
        elif kind == "flatten":
            mods.append(nn.Flatten())
            n = 1
            for d in shape:
                n *= d
            shape = (n,)
        elif kind == "linear":
            mods.append(nn.Linear(shape[0], p["out_features"], bias=p.get("bias", True)))
            shape = (p["out_features"],)
        elif kind == "softmax_cross_entropy":
            pass  # nn.CrossEntropyLoss on the logits
        else:
            fail(f"layer kind {kind!r} is not supported by the baseline")
    return nn.Sequential(*mods), shape[0]


def set_precision(torch, tf32):
    """FP32 means no TF32 anywhere (cuDNN allows TF32 by default in PyTorch)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):
        # PyTorch >= 2.9; the allow_tf32 flags are deprecated there.
        mode = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = mode
        conv.fp32_precision = mode
    else:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True  # the fastest algorithm per shape, as cudnnFind


def time_region(torch, fn, iters):
    """Milliseconds per iteration of fn() between two CUDA events (fn enqueues work)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def step_benchmark(torch, net, batch, tf32, steps, windows):
    set_precision(torch, tf32)
    torch.manual_seed(1)
    model, classes = build_model(torch, net)
    model = model.cuda()
    o = net["optimizer"]
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o.get("momentum", 0.9),
                          nesterov=o.get("nesterov", False),
                          weight_decay=o.get("weight_decay", 0.0))
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.rand(batch, *net["input"], device="cuda") * 2 - 1
    y = torch.randint(0, classes, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    # Warm-up on a side stream (cuDNN autotuning, momentum buffers), as the CUDA-graph docs do.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(5):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    eager = statistics.median(time_region(torch, step, steps) for _ in range(windows))

    graph_ms, note = None, ""
    try:
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = loss_fn(model(x), y)
            static_loss.backward()
            opt.step()
        g.replay()
        torch.cuda.synchronize()
        graph_ms = statistics.median(time_region(torch, g.replay, steps) for _ in range(windows))
    except Exception as e:  # report, keep the eager number
        note = f"graph capture failed: {e}"
    return eager * 1000, (graph_ms * 1000 if graph_ms is not None else None), note


def op_shapes(net, batch):
    """(name, kind, params, input shape) of every conv/linear/relu/maxpool layer at this batch."""
    shape = (batch,) + tuple(net["input"])
    counters = {}
    out = []
    for kind, p in net["layers"]:
        prefix = {"conv2d": "conv", "relu": "relu", "maxpool2d": "pool", "flatten": "flatten",
                  "linear": "fc", "softmax_cross_entropy": "loss"}[kind]
        counters[prefix] = counters.get(prefix, 0) + 1
        name = p.get("name") or (prefix if kind == "softmax_cross_entropy"
                                 else f"{prefix}{counters[prefix]}")
        out.append((name, kind, p, shape))
        if kind == "conv2d":
            kh, kw = pair(p.get("kernel"), "kernel")
            sh, sw = pair(p.get("stride", 1), "stride")
            ph, pw = pair(p.get("padding", 0), "padding")
            shape = (batch, p["out_channels"], (shape[2] + 2 * ph - kh) // sh + 1,
                     (shape[3] + 2 * pw - kw) // sw + 1)
        elif kind == "maxpool2d":
            kh, kw = pair(p.get("kernel"), "kernel")
            sh, sw = pair(p.get("stride", [kh, kw]), "stride")
            ph, pw = pair(p.get("padding", 0), "padding")
            shape = (batch, shape[1], (shape[2] + 2 * ph - kh) // sh + 1,
                     (shape[3] + 2 * pw - kw) // sw + 1)
        elif kind == "flatten":
            n = 1
            for d in shape[1:]:
                n *= d
            shape = (batch, n)
        elif kind == "linear":
            shape = (batch, p["out_features"])
    return out


def graph_time(torch, fn, launches, repeats):
    """Median and P95 microseconds per launch: K launches in a graph, replayed R times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    g.replay()
    torch.cuda.synchronize()
    samples = sorted(time_region(torch, g.replay, 1) * 1000 / launches for _ in range(repeats))
    p95 = samples[min(len(samples) - 1, int(0.95 * len(samples) + 0.999) - 1)]
    return statistics.median(samples), p95


def op_benchmark(torch, net, batch, tf32, launches, repeats):
    set_precision(torch, tf32)
    F = torch.nn.functional
    aten = torch.ops.aten
    rows = []
    torch.manual_seed(2)
    for name, kind, p, shape in op_shapes(net, batch):
        def rnd(*s):
            return torch.rand(*s, device="cuda") * 2 - 1
        if kind == "conv2d":
            kh, kw = pair(p.get("kernel"), "kernel")
            stride = list(pair(p.get("stride", 1), "stride"))
            pad = list(pair(p.get("padding", 0), "padding"))
            x = rnd(*shape)
            w = rnd(p["out_channels"], shape[1], kh, kw)
            y = F.conv2d(x, w, None, stride, pad)
            dy = rnd(*y.shape)

            def bwd(mask):
                return lambda: aten.convolution_backward(dy, x, w, None, stride, pad, [1, 1],
                                                         False, [0, 0], 1, mask)
            passes = [("fwd", lambda: F.conv2d(x, w, None, stride, pad)),
                      ("dgrad", bwd([True, False, False])),
                      ("wgrad", bwd([False, True, False]))]
        elif kind == "linear":
            x = rnd(*shape)
            w = rnd(p["out_features"], shape[1])
            dy = rnd(shape[0], p["out_features"])
            passes = [("fwd", lambda: F.linear(x, w)), ("dgrad", lambda: dy @ w),
                      ("wgrad", lambda: dy.t() @ x)]
        elif kind == "relu":
            if tf32:
                continue  # no matrix arithmetic: measured once
            x = rnd(*shape)
            passes = [("fwd", lambda: F.relu(x))]
        elif kind == "maxpool2d":
            if tf32:
                continue
            kh, kw = pair(p.get("kernel"), "kernel")
            stride = pair(p.get("stride", [kh, kw]), "stride")
            pad = pair(p.get("padding", 0), "padding")
            x = rnd(*shape)
            passes = [("fwd", lambda: F.max_pool2d(x, (kh, kw), stride, pad))]
        else:
            continue
        for pname, fn in passes:
            med, p95 = graph_time(torch, fn, launches, repeats)
            rows.append((f"{name}.{pname}", "x".join(map(str, shape)), med, p95))
    return rows


def fmt_us(v):
    return "-" if v is None else f"{v:.1f}"


def table(cols, rows):
    w = [max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(str(c))
         for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i])
                                   for i, c in enumerate(cells))
    return "\n".join([line(cols), "  ".join("-" * x for x in w)] + [line(r) for r in rows])


def md_table(cols, rows):
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="config whose model is timed (default configs/mnist.yaml)")
    ap.add_argument("--batches", default="64,128,512", help="whole-step batch sizes")
    ap.add_argument("--precision", default="both", choices=["fp32", "tf32", "both"])
    ap.add_argument("--steps", type=int, default=100, help="steps per timing window")
    ap.add_argument("--windows", type=int, default=5, help="timing windows (median taken)")
    ap.add_argument("--op-batch", type=int, default=128, help="batch of the per-op timings")
    ap.add_argument("--launches", type=int, default=20, help="launches per graph (per op)")
    ap.add_argument("--repeats", type=int, default=50, help="graph replays (per op)")
    ap.add_argument("--no-ops", action="store_true", help="whole-step timings only")
    ap.add_argument("--no-step", action="store_true", help="per-op timings only")
    ap.add_argument("--markdown", help="also write the tables as Markdown to FILE")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        fail("PyTorch is not importable in this Python")
    if not torch.cuda.is_available():
        print("torch_baseline: no CUDA device", file=sys.stderr)
        return 1
    net = load_network(args.config)
    precisions = {"fp32": [False], "tf32": [True], "both": [False, True]}[args.precision]
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        fail(f"--batches: expected a list such as 64,128,512, got {args.batches!r}")

    header = [
        f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
        f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}",
        f"network: {net['source']}; SGD lr {net['optimizer']['lr']} momentum "
        f"{net['optimizer'].get('momentum', 0.9)}; data on the GPU; cudnn.benchmark on",
        "command: " + " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
    ]
    print("\n".join(header))
    md = ["# PyTorch baseline", ""] + ["    " + h for h in header]

    if not args.no_step:
        cols = ["batch", "prec", "eager us/step", "eager img/s", "graph us/step", "graph img/s",
                "note"]
        rows = []
        for b in batches:
            for tf32 in precisions:
                eager, graph, note = step_benchmark(torch, net, b, tf32, args.steps, args.windows)
                rows.append((b, "tf32" if tf32 else "fp32", fmt_us(eager), f"{b / eager * 1e6:.0f}",
                             fmt_us(graph), "-" if graph is None else f"{b / graph * 1e6:.0f}",
                             note))
        print("\nWhole training step (forward + backward + SGD momentum)")
        print(table(cols, rows))
        md += ["", "## Whole training step", "", md_table(cols, rows)]

    if not args.no_ops:
        cols = ["op", "input", "prec", "median us", "p95 us"]
        rows = []
        for tf32 in precisions:
            for name, shape, med, p95 in op_benchmark(torch, net, args.op_batch, tf32,
                                                      args.launches, args.repeats):
                rows.append((name, shape, "tf32" if tf32 else "fp32", f"{med:.1f}", f"{p95:.1f}"))
        print(f"\nPer op through torch (cuDNN/cuBLAS), batch {args.op_batch}: {args.launches} "
              f"launches per CUDA graph, {args.repeats} replays, same buffers every launch")
        print(table(cols, rows))
        md += ["", f"## Per op, batch {args.op_batch}", "", md_table(cols, rows)]

    if args.markdown:
        tmp = args.markdown + ".tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(md) + "\n")
        os.replace(tmp, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
