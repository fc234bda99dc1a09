"""ZeRO-Inference, DeepSpeed's recipe, unmodified DeepSpeed API: a Transformers causal LM whose
weights stay on the host (ZeRO-3 ``offload_param: cpu``) and stream to the device module by
module, the next modules prefetched while one computes; ``deepspeed.initialize(model=...,
config=...)`` without an optimizer, then ``engine.module(...)`` and ``engine.module.generate()``.

    dslaunch run --as-deepspeed --nproc-per-node 1 examples/zero_inference.py \\
        --config configs/zero_inference.json --arch llama --hidden 4096 --layers 32 --new-tokens 16
    deepspeed --num_gpus 1 examples/zero_inference.py ...     # the same script under DeepSpeed

The model comes from ``--model-path`` (a local Transformers directory) or from a config sized by
the arguments (``--arch llama|gpt2``), built fast: no random init (``no_init_weights``), built in
the inference dtype, then every weight filled from one seeded 1M-element random block tiled over
it (norm weights 1, biases 0): a memory-bandwidth pass instead of a normal_() per weight, so a
multi-billion-parameter model builds in seconds on a CPU.

Measures (rank 0 prints one JSON line ``ZERO_INFERENCE {...}`` and writes it to ``--out``):
prefill tokens/s (``engine.module(input_ids)`` of batch x prompt-len, no cache, after one warm-up
pass that records the module order), generate tokens/s (``generate()`` of ``--new-tokens`` greedy
tokens per sequence), peak device memory, the model's bytes, and where the parameters are at
rest (``ds_status``, bytes still on the device, the device of ``ds_tensor``). ``--check``: the
same greedy generate on the plain, unsharded model first (on the device, before
``initialize``), and whether the tokens are equal.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs",
                                                    "zero_inference.json"))
    p.add_argument("--model-path", default=None, help="a local Transformers model directory")
    p.add_argument("--arch", default="llama", choices=("llama", "gpt2"))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--intermediate", type=int, default=None, help="default: 8/3 x hidden (llama)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--prefill-iters", type=int, default=2)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--check", action="store_true",
                   help="compare with generate() on the plain, unsharded model")
    p.add_argument("--gpu-cap-gb", type=float, default=None,
                   help="after initialize, cap this process's device memory (CUDA) at this many "
                        "GiB (torch.cuda.set_per_process_memory_fraction): less than the weights")
    p.add_argument("--out", default=None, help="write the result JSON here (rank 0)")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    args, _ = p.parse_known_args(argv)
    return args


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def model_config(args):
    from transformers import GPT2Config, LlamaConfig

    if args.arch == "gpt2":
        return GPT2Config(n_embd=args.hidden, n_layer=args.layers, n_head=args.heads,
                          vocab_size=args.vocab, n_positions=max(1024, args.prompt_len +
                                                                  args.new_tokens))
    inter = args.intermediate or (int(8 * args.hidden / 3) + 255) // 256 * 256
    return LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads,
                       num_key_value_heads=args.kv_heads or args.heads,
                       intermediate_size=inter, vocab_size=args.vocab,
                       max_position_embeddings=max(2048, args.prompt_len + args.new_tokens),
                       tie_word_embeddings=False)


def fill_fast(model, seed: int) -> None:
    """Every weight from one seeded random block tiled over it (std 0.02), norm weights 1 and
    biases 0: deterministic, and as fast as a copy."""
    g = torch.Generator().manual_seed(seed)
    block_n = 1 << 20
    block = (torch.randn(block_n + 17, generator=g) * 0.02)
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            flat = p.data.view(-1)
            if name.endswith("bias"):
                flat.zero_()
                continue
            if p.dim() == 1:  # norm weights
                flat.fill_(1.0)
                continue
            src = block[i % 17: i % 17 + block_n].to(p.dtype)
            n, k = flat.numel(), flat.numel() // block_n
            if k:
                flat[:k * block_n].view(k, block_n).copy_(src)
            if n - k * block_n:
                flat[k * block_n:].copy_(src[:n - k * block_n])


def build_model(args):
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[args.dtype]
    if args.model_path:
        return AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype)
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(model_config(args))
    finally:
        torch.set_default_dtype(old)
    model.to(dtype)
    fill_fast(model, args.seed)
    return model


def device_sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory() -> int | None:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return None


def at_rest(model) -> dict:
    """Where the parameters are between passes."""
    params = list({id(p): p for p in model.parameters()}.values())
    status = {}
    for p in params:
        s = getattr(p, "ds_status", None)
        key = getattr(s, "name", str(s))
        status[key] = status.get(key, 0) + 1
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in params
                if p.device.type != "cpu" or not torch.cuda.is_available()}
    on_device = sum(n for ptr, n in storages.items() if n)
    shard_devices = sorted({str(p.ds_tensor.device) for p in params
                            if getattr(p, "ds_tensor", None) is not None})
    pinned = [p.ds_tensor.is_pinned() for p in params
              if getattr(p, "ds_tensor", None) is not None and p.ds_tensor.device.type == "cpu"]
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in params)
    return {"params": len(params), "numel": numel, "status": status,
            "param_storage_bytes": on_device, "ds_tensor_devices": shard_devices,
            "ds_tensor_pinned": (all(pinned) if pinned else None)}


def main(argv=None):
    args = parse_args(argv)
    import deepspeed  # dslaunch under `dslaunch run --as-deepspeed`

    torch.manual_seed(args.seed)
    rank = int(os.environ.get("RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
    else:
        device = torch.device("cpu")
    with open(args.config) as f:
        ds_config = json.load(f)
    if args.dtype == "fp32":
        ds_config.pop("bf16", None)
        ds_config.pop("fp16", None)
    elif args.dtype == "fp16":
        ds_config.pop("bf16", None)
        ds_config["fp16"] = {"enabled": True}

    t0 = time.perf_counter()
    model = build_model(args).eval()
    build_s = time.perf_counter() - t0
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=g)
    gen_kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                  do_sample=False, pad_token_id=0)

    reference = None
    if args.check:
        ref = copy.deepcopy(model).to(device)
        with torch.no_grad():
            reference = ref.generate(prompt.to(device), attention_mask=torch.ones_like(
                prompt, device=device), **gen_kw).cpu()
        del ref

    t0 = time.perf_counter()
    engine, *_ = deepspeed.initialize(model=model, config=ds_config)
    device_sync()
    init_s = time.perf_counter() - t0
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        if args.gpu_cap_gb:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_cap_gb * 2**30 / total),
                                                       device)
        torch.cuda.reset_peak_memory_stats()
    module = engine.module
    rest_before = at_rest(module)

    ids = prompt.to(device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        t0 = time.perf_counter()
        module(input_ids=ids, use_cache=False)  # warm-up: records the module order
        device_sync()
        warm_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(args.prefill_iters):
            module(input_ids=ids, use_cache=False)
        device_sync()
        prefill_s = (time.perf_counter() - t0) / max(1, args.prefill_iters)
        t0 = time.perf_counter()
        out = module.generate(ids, attention_mask=mask, **gen_kw)
        device_sync()
        gen_s = time.perf_counter() - t0
    new = out[:, args.prompt_len:].cpu()
    result = {
        "runtime": "dslaunch" if "dslaunch" in getattr(deepspeed, "__file__", "") or
        hasattr(deepspeed, "__dslaunch__") else "deepspeed",
        "deepspeed_version": getattr(deepspeed, "__version__", None),
        "device": torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu",
        "arch": args.arch if not args.model_path else args.model_path,
        "params": sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters()),
        "model_bytes": model_bytes, "dtype": args.dtype, "batch": args.batch,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "build_s": round(build_s, 3), "init_s": round(init_s, 3),
        "warmup_forward_s": round(warm_s, 4),
        "prefill_s": round(prefill_s, 4),
        "prefill_tokens_per_s": args.batch * args.prompt_len / prefill_s,
        "generate_s": round(gen_s, 4),
        "generate_tokens_per_s": args.batch * args.new_tokens / gen_s,
        "peak_gpu_bytes": peak_memory(),
        "gpu_cap_gb": args.gpu_cap_gb,
        "at_rest_before": rest_before,
        "at_rest_after": at_rest(module),
        "tokens": new.tolist(),
    }
    if reference is not None:
        result["reference_tokens"] = reference[:, args.prompt_len:].tolist()
        result["match"] = result["reference_tokens"] == result["tokens"]
    if rank == 0:
        print("ZERO_INFERENCE " + json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    if args.check and not result["match"]:
        sys.exit(3)


if __name__ == "__main__":
    main()
