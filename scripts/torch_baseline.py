#!/usr/bin/env python3
"""PyTorch + cuDNN baseline for ./bench: the same network and SGD-momentum step, data on the GPU.

Whole step: eager and one CUDA graph per step, FP32 and TF32 (and BF16 autocast with
--precision bf16), batch 64/128/512, printing us/step and images/s as ./bench does. Per op (cross-check of ./bench's cuDNN/cuBLAS columns): conv
forward / input gradient / weight gradient through aten.convolution_backward, linear through
matmuls, ReLU and max-pool, each captured K times in a CUDA graph and replayed R times (median
and P95 per launch). Inference (--infer): the forward alone under torch.inference_mode(), eager
and CUDA graph, batch 1/32/256, FP32/TF32/BF16 autocast (scripts/bench_infer.sh).

    python3 scripts/torch_baseline.py [--config configs/mnist.yaml] [--markdown FILE]

The network comes from the config's model section (PyYAML needed), residual blocks, BatchNorm,
grouped convs, pooling and dropout included, as one torch module whose attribute names are the
layers' names (conv3, bn3, ...); without --config, and without configs/mnist.yaml, the reference
network is built in.

    python3 scripts/torch_baseline.py --checkpoint logs/resnet_fashion/best.safetensors \
        [--expect-accuracy 94.71]

loads one of our checkpoints into that module (built from the checkpoint's own resolved config)
and reports its test accuracy, computed by torch in eval mode.
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


# Default names as the trainer gives them (layers/layer_spec.cpp, finalize_layer_specs): per
# prefix, counting in file order, a residual block before its layers and its layers before its
# shortcut's. Only layers with tensors need to match (conv, bn, fc): the others have no state.
PREFIX = {"conv2d": "conv", "relu": "relu", "maxpool2d": "pool", "flatten": "flatten",
          "linear": "fc", "softmax_cross_entropy": "loss", "residual": "res",
          "batchnorm2d": "bn", "batchnorm1d": "bn", "avgpool2d": "avgpool",
          "global_avgpool": "global_avgpool", "dropout": "dropout"}


def parse_layers(items, where):
    """[(kind, params)] from a config's layer list; a residual's params hold parsed lists."""
    layers = []
    for i, item in enumerate(items or []):
        at = f"{where}[{i}]"
        if isinstance(item, str):
            kind, params = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            kind, params = next(iter(item.items()))
            params = dict(params or {})
        else:
            fail(f"{at}: expected a name or a one-key map, got {item!r}")
        if kind == "residual":
            if not params.get("layers"):
                fail(f"{at}.residual: needs its layers")
            params["layers"] = parse_layers(params["layers"], f"{at}.residual.layers")
            params["shortcut"] = parse_layers(params.get("shortcut"), f"{at}.residual.shortcut")
        layers.append((kind, params))
    return layers


def name_layers(layers, counters=None):
    counters = {} if counters is None else counters
    for kind, p in layers:
        prefix = PREFIX.get(kind, kind)
        counters[prefix] = counters.get(prefix, 0) + 1
        if not p.get("name"):
            p["name"] = prefix if kind == "softmax_cross_entropy" else f"{prefix}{counters[prefix]}"
        if kind == "residual":
            name_layers(p["layers"], counters)
            name_layers(p["shortcut"], counters)
    return layers


def network_from_config(cfg, source):
    model = (cfg or {}).get("model") or fail(f"{source}: no model section")
    inp = model.get("input") or fail(f"{source}: model.input is missing")
    layers = name_layers(parse_layers(model.get("layers"), "model.layers"))
    opt = dict(REFERENCE["optimizer"])
    opt.update(cfg.get("optimizer") or {})
    if opt.get("type", "sgd") != "sgd":
        print(f"torch_baseline: note: {source} uses {opt['type']}; the baseline times SGD "
              "momentum as the anchors do", file=sys.stderr)
    training = cfg.get("training") or {}
    return {"input": (inp["channels"], inp["height"], inp["width"]), "layers": layers,
            "optimizer": opt, "source": source,
            "label_smoothing": float(training.get("label_smoothing", 0.0)),
            "data": cfg.get("data") or {}}


def read_yaml(text, what):
    try:
        import yaml
    except ImportError:
        fail(f"reading {what} needs PyYAML (pip install pyyaml), or leave out --config")
    import re

    class Loader(yaml.SafeLoader):
        pass

    # PyYAML follows YAML 1.1, where a float needs a dot: the trainer's resolved config (stored in
    # every checkpoint) writes 1e-05, which it would read as a string. YAML 1.2's float form:
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
                   r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))
    return yaml.load(text, Loader=Loader)


def load_network(path):
    if path is None:
        if not os.path.exists("configs/mnist.yaml"):
            net = dict(REFERENCE)
            net["layers"] = name_layers([(k, dict(p)) for k, p in REFERENCE["layers"]])
            net["label_smoothing"] = 0.0
            return net
        path = "configs/mnist.yaml"
    with open(path) as f:
        return network_from_config(read_yaml(f.read(), path), path)


def conv_out(size, k, s, p, d=1):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def make_module(nn, kind, p, shape):
    """(torch module or None, output shape per image) of one non-residual layer."""
    if kind == "conv2d":
        kh, kw = pair(p.get("kernel"), "conv2d.kernel")
        sh, sw = pair(p.get("stride", 1), "conv2d.stride")
        ph, pw = pair(p.get("padding", 0), "conv2d.padding")
        dh, dw = pair(p.get("dilation", 1), "conv2d.dilation")
        m = nn.Conv2d(shape[0], p["out_channels"], (kh, kw), (sh, sw), (ph, pw), (dh, dw),
                      groups=p.get("groups", 1), bias=p.get("bias", True))
        return m, (p["out_channels"], conv_out(shape[1], kh, sh, ph, dh),
                   conv_out(shape[2], kw, sw, pw, dw))
    if kind in ("batchnorm2d", "batchnorm1d"):
        cls = nn.BatchNorm2d if kind == "batchnorm2d" else nn.BatchNorm1d
        return cls(shape[0], eps=p.get("eps", 1e-5), momentum=p.get("momentum", 0.1)), shape
    if kind == "relu":
        return nn.ReLU(), shape
    if kind in ("maxpool2d", "avgpool2d"):
        kh, kw = pair(p.get("kernel"), f"{kind}.kernel")
        sh, sw = pair(p.get("stride", [kh, kw]), f"{kind}.stride")
        ph, pw = pair(p.get("padding", 0), f"{kind}.padding")
        m = (nn.MaxPool2d((kh, kw), (sh, sw), (ph, pw)) if kind == "maxpool2d"
             else nn.AvgPool2d((kh, kw), (sh, sw), (ph, pw), count_include_pad=True))
        return m, (shape[0], conv_out(shape[1], kh, sh, ph), conv_out(shape[2], kw, sw, pw))
    if kind == "global_avgpool":
        return nn.AdaptiveAvgPool2d(1), (shape[0], 1, 1)
    if kind == "dropout":
        return nn.Dropout(p.get("p", 0.5)), shape
    if kind == "flatten":
        n = 1
        for d in shape:
            n *= d
        return nn.Flatten(), (n,)
    if kind == "linear":
        return nn.Linear(shape[0], p["out_features"], bias=p.get("bias", True)), (p["out_features"],)
    if kind == "softmax_cross_entropy":
        return None, shape  # nn.CrossEntropyLoss on the logits
    fail(f"layer kind {kind!r} is not supported by the baseline")


def build_model(torch, net):
    """The config's network as one torch module whose attributes are the layers' names, so that
    its state_dict keys are the trainer's checkpoint tensor names (conv3.weight, bn3.running_var).
    A residual block runs its layers and its shortcut (identity when empty) and adds them."""
    nn = torch.nn

    class ZooNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.plan, shape = self._plan(net["layers"], tuple(net["input"]), False)
            self.out_features = shape[0]

        def _plan(self, layers, shape, in_block):
            plan = []
            for kind, p in layers:
                name = p["name"]
                if kind == "residual":
                    if in_block:
                        fail(f"{name}: residual blocks do not nest")
                    branch, a = self._plan(p["layers"], shape, True)
                    shortcut, b = self._plan(p["shortcut"], shape, True)
                    if a != b:
                        fail(f"residual block {name}: its layers give {a}, its shortcut {b}")
                    plan.append(("residual", branch, shortcut))
                    shape = a
                    continue
                module, shape = make_module(nn, kind, p, shape)
                if module is not None:
                    if "." in name:
                        fail(f"layer name {name!r}: torch attribute names cannot hold '.'")
                    self.add_module(name, module)
                    plan.append(("layer", name))
            return plan, shape

        def _run(self, plan, x):
            for step in plan:
                if step[0] == "residual":
                    y = self._run(step[1], x)
                    x = y + (self._run(step[2], x) if step[2] else x)
                else:
                    x = getattr(self, step[1])(x)
            return x

        def forward(self, x):
            return self._run(self.plan, x)

    model = ZooNet()
    return model, model.out_features


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


def step_benchmark(torch, net, batch, precision, steps, windows):
    """precision: fp32 (no TF32 anywhere), tf32, or bf16 (autocast to bfloat16 around forward and
    loss, FP32 master weights and SGD, as torch's mixed-precision recipe; TF32 for what autocast
    leaves in FP32)."""
    set_precision(torch, precision != "fp32")
    bf16 = precision == "bf16"
    torch.manual_seed(1)
    model, classes = build_model(torch, net)
    model = model.cuda()
    o = net["optimizer"]
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o.get("momentum", 0.9),
                          nesterov=o.get("nesterov", False),
                          weight_decay=o.get("weight_decay", 0.0))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=net.get("label_smoothing", 0.0))
    x = torch.rand(batch, *net["input"], device="cuda") * 2 - 1
    y = torch.randint(0, classes, (batch,), device="cuda")

    def forward_loss():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            return loss_fn(model(x), y)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_loss()
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
            static_loss = forward_loss()
            static_loss.backward()
            opt.step()
        g.replay()
        torch.cuda.synchronize()
        graph_ms = statistics.median(time_region(torch, g.replay, steps) for _ in range(windows))
    except Exception as e:  # report, keep the eager number
        note = f"graph capture failed: {e}"
    return eager * 1000, (graph_ms * 1000 if graph_ms is not None else None), note


def infer_benchmark(torch, net, batch, precision, iters, windows):
    """The forward alone under torch.inference_mode(), eval mode (BatchNorm on running stats,
    dropout off), no loss: eager and one CUDA graph per forward. precision as step_benchmark."""
    set_precision(torch, precision != "fp32")
    bf16 = precision == "bf16"
    torch.manual_seed(1)
    model, _ = build_model(torch, net)
    model = model.cuda().eval()
    x = torch.rand(batch, *net["input"], device="cuda") * 2 - 1

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            return model(x)

    with torch.inference_mode():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(5):
                forward()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        eager = statistics.median(time_region(torch, forward, iters) for _ in range(windows))
        graph_ms, note = None, ""
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                forward()
            g.replay()
            torch.cuda.synchronize()
            graph_ms = statistics.median(time_region(torch, g.replay, iters)
                                         for _ in range(windows))
        except Exception as e:  # report, keep the eager number
            note = f"graph capture failed: {e}"
    return eager * 1000, (graph_ms * 1000 if graph_ms is not None else None), note


def op_shapes(torch, net, batch):
    """(name, kind, module, input shape) of every conv/linear/relu/maxpool layer at this batch,
    residual blocks included, recorded by forward hooks on one pass of the model."""
    model, _ = build_model(torch, net)
    kinds = {torch.nn.Conv2d: "conv2d", torch.nn.Linear: "linear", torch.nn.ReLU: "relu",
             torch.nn.MaxPool2d: "maxpool2d"}
    out, hooks = [], []
    for name, m in model.named_children():
        kind = kinds.get(type(m))
        if kind:
            hooks.append(m.register_forward_hook(
                lambda mod, inp, _o, name=name, kind=kind: out.append(
                    (name, kind, mod, tuple(inp[0].shape)))))
    model.eval()
    with torch.no_grad():
        model(torch.zeros(batch, *net["input"]))
    for h in hooks:
        h.remove()
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
    for name, kind, m, shape in op_shapes(torch, net, batch):
        def rnd(*s):
            return torch.rand(*s, device="cuda") * 2 - 1
        if kind == "conv2d":
            stride, pad, dil, groups = list(m.stride), list(m.padding), list(m.dilation), m.groups
            x = rnd(*shape)
            w = rnd(*m.weight.shape)
            y = F.conv2d(x, w, None, stride, pad, dil, groups)
            dy = rnd(*y.shape)

            def bwd(mask):
                return lambda: aten.convolution_backward(dy, x, w, None, stride, pad, dil,
                                                         False, [0, 0], groups, mask)
            passes = [("fwd", lambda: F.conv2d(x, w, None, stride, pad, dil, groups)),
                      ("dgrad", bwd([True, False, False])),
                      ("wgrad", bwd([False, True, False]))]
        elif kind == "linear":
            x = rnd(*shape)
            w = rnd(m.out_features, shape[1])
            dy = rnd(shape[0], m.out_features)
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
            x = rnd(*shape)
            passes = [("fwd", lambda: F.max_pool2d(x, m.kernel_size, m.stride, m.padding))]
        else:
            continue
        for pname, fn in passes:
            med, p95 = graph_time(torch, fn, launches, repeats)
            rows.append((f"{name}.{pname}", "x".join(map(str, shape)), med, p95))
    return rows


def read_safetensors(torch, path):
    """(metadata, {name: tensor}) of a safetensors file, without the safetensors package."""
    import json
    import struct
    dtypes = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64,
              "I32": torch.int32, "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8}
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        fail(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, e in header.items():
        if e["dtype"] not in dtypes:
            fail(f"{path}: tensor {name}: dtype {e['dtype']} not handled here")
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dtypes[e["dtype"]])
        tensors[name] = t.reshape(e["shape"]) if e["shape"] else t.reshape(())
    return meta, tensors


def read_idx(path):
    import gzip
    import struct
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            opener = gzip.open if p.endswith(".gz") else open
            with opener(p, "rb") as f:
                raw = f.read()
            dims = raw[3]
            shape = struct.unpack(">" + "I" * dims, raw[4:4 + 4 * dims])
            return shape, raw[4 + 4 * dims:]
    fail(f"{path}[.gz]: not found")


def load_test_set(torch, net, meta):
    """The config's test images as a float tensor (N, C, H, W), normalized as in training, and
    the labels. IDX (data.dir/t10k-*) or a class-folder tree (data.test; needs Pillow)."""
    data = net["data"]
    c, h, w = net["input"]
    fmt = data.get("format")
    if fmt == "idx":
        d = data.get("dir") or fail("data.dir is missing")
        shape, pixels = read_idx(os.path.join(d, "t10k-images-idx3-ubyte"))
        _, labels = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte"))
        x = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(shape[0], 1, shape[1],
                                                                            shape[2])
        y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
    elif fmt == "folder":
        try:
            from PIL import Image
        except ImportError:
            fail("reading an image folder needs Pillow (pip install pillow)")
        root = data.get("test") or fail("data.test is missing: no test folder to score")
        classes = json_list(meta, "classes") or sorted(os.listdir(root))
        xs, ys = [], []
        for label, cls in enumerate(classes):
            folder = os.path.join(root, cls)
            for fn in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                img = Image.open(os.path.join(folder, fn)).convert("L" if c == 1 else "RGB")
                if img.size != (w, h):
                    img = img.resize((w, h))
                t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
                xs.append(t.reshape(h, w, c).permute(2, 0, 1))
                ys.append(label)
        if not xs:
            fail(f"{root}: no images found under its class folders")
        x, y = torch.stack(xs), torch.tensor(ys)
    else:
        fail(f"data.format {fmt!r}: the accuracy check reads idx or folder test sets")
    mean = torch.tensor(json_list(meta, "mean") or [0.0] * c).reshape(1, c, 1, 1)
    std = torch.tensor(json_list(meta, "std") or [1.0] * c).reshape(1, c, 1, 1)
    return (x.float() / 255.0 - mean) / std, y


def json_list(meta, key):
    import json
    return json.loads(meta[key]) if key in meta else None


def score_checkpoint(torch, path, config_path, data_dir):
    """Loads our checkpoint into the torch module built from its own resolved config (or
    --config) and scores the test set. Returns (accuracy %, images, the checkpoint's best %)."""
    meta, tensors = read_safetensors(torch, path)
    if config_path:
        net = load_network(config_path)
    elif "config" in meta:
        net = network_from_config(read_yaml(meta["config"], path + " (its config)"), path)
    else:
        fail(f"{path}: no config in its metadata; pass --config")
    if data_dir:
        net["data"]["dir"] = data_dir
    model, _ = build_model(torch, net)
    state = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    want = model.state_dict()
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]
    if missing or extra:
        fail(f"{path}: tensors do not match the torch module: missing {missing[:8]}, "
             f"unexpected {extra[:8]}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(want[k].shape):
            fail(f"{path}: {k}: shape {tuple(v.shape)}, the torch module has {tuple(want[k].shape)}")
    model.load_state_dict({k: v.to(want[k].dtype) for k, v in state.items()}, strict=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        set_precision(torch, False)
    model = model.to(device).eval()
    x, y = load_test_set(torch, net, meta)
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            logits = model(x[i:i + 1000].to(device))
            correct += int((logits.argmax(1).cpu() == y[i:i + 1000]).sum())
    best = float(meta.get("best_accuracy", "-1"))
    return 100.0 * correct / len(y), len(y), (100.0 * best if 0 <= best <= 1 else best)


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


def eager_graph_section(bench, batches, precisions, cols, title, heading, csv_path, md):
    """Runs bench(batch, precision) -> (eager us, graph us or None, note) for every batch and
    precision; prints the table under title, appends it to md under heading and, when csv_path
    is given, writes it there (through a temporary file)."""
    rows = []
    for b in batches:
        for prec in precisions:
            eager, graph, note = bench(b, prec)
            rows.append((b, prec, fmt_us(eager), f"{b / eager * 1e6:.0f}",
                         fmt_us(graph), "-" if graph is None else f"{b / graph * 1e6:.0f}",
                         note))
    print(f"\n{title}")
    print(table(cols, rows))
    md += ["", f"## {heading}", "", md_table(cols, rows)]
    if csv_path:
        import csv
        tmp = csv_path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["batch", "precision", "eager_us", "graph_us", "note"])
            for r in rows:
                w.writerow([r[0], r[1], r[2], r[4], r[6]])
        os.replace(tmp, csv_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="config whose model is timed (default configs/mnist.yaml)")
    ap.add_argument("--batches", help="whole-step batch sizes (default 64,128,512; with --infer "
                    "1,32,256)")
    ap.add_argument("--precision", default="both",
                    help="comma-separated fp32, tf32, bf16 (whole step only), or both (= fp32,tf32)")
    ap.add_argument("--steps", type=int, default=100, help="steps per timing window")
    ap.add_argument("--windows", type=int, default=5, help="timing windows (median taken)")
    ap.add_argument("--op-batch", type=int, default=128, help="batch of the per-op timings")
    ap.add_argument("--launches", type=int, default=20, help="launches per graph (per op)")
    ap.add_argument("--repeats", type=int, default=50, help="graph replays (per op)")
    ap.add_argument("--no-ops", action="store_true", help="whole-step timings only")
    ap.add_argument("--no-step", action="store_true", help="per-op timings only")
    ap.add_argument("--markdown", help="also write the tables as Markdown to FILE")
    ap.add_argument("--step-csv", help="also write the whole-step rows as CSV to FILE "
                    "(batch,precision,eager_us,graph_us,note; scripts/bench_zoo.sh reads it)")
    ap.add_argument("--infer", action="store_true",
                    help="instead of the step and op timings: the inference forward "
                    "(torch.inference_mode, eval) at --batches (default here 1,32,256), eager and "
                    "CUDA graph, in each --precision (fp32, tf32, bf16 autocast)")
    ap.add_argument("--infer-csv", help="with --infer: also write the rows as CSV to FILE "
                    "(batch,precision,eager_us,graph_us,note; scripts/bench_infer.sh reads it)")
    ap.add_argument("--checkpoint", help="instead of timing: load this checkpoint (safetensors) "
                    "into the torch module and report its test accuracy")
    ap.add_argument("--data-dir", help="with --checkpoint: the IDX folder, if not data.dir")
    ap.add_argument("--expect-accuracy", type=float,
                    help="with --checkpoint: exit 1 unless torch scores this (percent)")
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="allowed difference for --expect-accuracy, in points (default 0.05)")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        fail("PyTorch is not importable in this Python")
    if args.checkpoint:
        acc, count, best = score_checkpoint(torch, args.checkpoint, args.config, args.data_dir)
        print(f"{args.checkpoint}: torch test accuracy {acc:.2f}% of {count} images "
              f"(the checkpoint's best evaluation: {best:.2f}%)")
        if args.expect_accuracy is not None and abs(acc - args.expect_accuracy) > args.tolerance:
            print(f"torch_baseline: expected {args.expect_accuracy:.2f}% within "
                  f"{args.tolerance} points", file=sys.stderr)
            return 1
        return 0
    if not torch.cuda.is_available():
        print("torch_baseline: no CUDA device", file=sys.stderr)
        return 1
    net = load_network(args.config)
    precisions = []
    for p in args.precision.split(","):
        for q in (["fp32", "tf32"] if p == "both" else [p]):
            if q not in ("fp32", "tf32", "bf16"):
                fail(f"--precision: {q!r} is not one of fp32, tf32, bf16, both")
            if q not in precisions:
                precisions.append(q)
    if args.batches is None:
        args.batches = "1,32,256" if args.infer else "64,128,512"
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

    if args.infer:
        eager_graph_section(
            lambda b, prec: infer_benchmark(torch, net, b, prec, args.steps, args.windows),
            batches, precisions,
            ["batch", "prec", "eager us", "eager img/s", "graph us", "graph img/s", "note"],
            "Inference forward (torch.inference_mode, eval)", "Inference forward",
            args.infer_csv, md)
        args.no_step = args.no_ops = True

    if not args.no_step:
        eager_graph_section(
            lambda b, prec: step_benchmark(torch, net, b, prec, args.steps, args.windows),
            batches, precisions,
            ["batch", "prec", "eager us/step", "eager img/s", "graph us/step", "graph img/s",
             "note"],
            "Whole training step (forward + backward + SGD momentum)", "Whole training step",
            args.step_csv, md)

    if not args.no_ops:
        cols = ["op", "input", "prec", "median us", "p95 us"]
        rows = []
        for prec in precisions:
            if prec == "bf16":
                continue  # the per-op cross-check covers ./bench's FP32 and TF32 columns
            tf32 = prec == "tf32"
            for name, shape, med, p95 in op_benchmark(torch, net, args.op_batch, tf32,
                                                      args.launches, args.repeats):
                rows.append((name, shape, prec, f"{med:.1f}", f"{p95:.1f}"))
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
