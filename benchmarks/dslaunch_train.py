"""dslaunch side of bench_train: the bench GPT trained through the public API only.

    OMP_NUM_THREADS=1 dslaunch run --nproc-per-node 2 benchmarks/dslaunch_train.py \
        --out DIR --stage 0 [--offload] [--precision bf16]

Same model, data, timed loop and result file as the peers (peer_scripts/common.py); the config is
``peer_scripts/zero_config.train_config``, the one DeepSpeed gets. A config that dslaunch rejects
as not supported yet is written to ``<out>/unsupported.json`` (exit code 3) so the benchmark can
report "not supported" instead of failing.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_scripts"))

import common
from zero_config import train_config

UNSUPPORTED_EXIT = 3


def main():
    p = common.parser(__doc__)
    p.add_argument("--stage", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--offload", action="store_true", help="offload_optimizer: cpu")
    args = p.parse_args()
    config = train_config(args.stage, args.precision, args.offload, args.micro_batch, args.lr,
                          args.zero_extra)

    import dslaunch

    model = common.build_model(args)
    try:
        engine, _, _, _ = dslaunch.initialize(model=model, model_parameters=model.parameters(),
                                              config=config)
    except Exception as exc:  # the config error type is dslaunch's; match on the message
        text = str(exc)
        if "not supported" in text:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "unsupported.json").write_text(json.dumps({"message": text}))
            print(f"not supported: {text}", file=sys.stderr)
            sys.exit(UNSUPPORTED_EXIT)
        raise
    rank, world = common.rank_world()

    def step(tokens, targets):
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        return loss

    times, losses = common.run_loop(args, step, common.build_batches(args, rank, world),
                                   sync=common.device_sync(args))
    extra = {"stage": args.stage, "offload": args.offload, "dslaunch": dslaunch.__version__}
    try:
        extra["memory_breakdown"] = engine.memory_breakdown()
    except Exception as exc:
        extra["memory_breakdown"] = f"unavailable: {exc}"
    try:
        json.dumps(extra["memory_breakdown"])
    except TypeError:
        extra["memory_breakdown"] = repr(extra["memory_breakdown"])
    common.write_result(args, "dslaunch", times, losses, extra)


if __name__ == "__main__":
    main()
