"""DeepSpeed's docs/_tutorials/flops-profiler.md, its three usages: the engine's profiler from the
config's ``flops_profiler`` section (the tutorial's JSON, profile_step 1), ``get_model_profile``
on a model ("Usage Outside the DeepSpeed Runtime"), and ``FlopsProfiler(model)`` with
start_profile / stop_profile / get_total_flops / get_total_macs / get_total_params /
print_model_profile / end_profile around one forward ("In Model Training Workflow")."""

import _tiny
import deepspeed
import torch
from deepspeed.profiling.flops_profiler import FlopsProfiler, get_model_profile

args = _tiny.args()
model = _tiny.model()
engine, _, loader, _ = deepspeed.initialize(args=args, model=model,
                                            model_parameters=model.parameters(),
                                            training_data=_tiny.dataset())
criterion = torch.nn.CrossEntropyLoss()
it = iter(loader)
for step in range(args.steps):
    x, y = next(it)
    loss = criterion(engine(x.to(engine.device)), y.to(engine.device))
    engine.backward(loss)
    engine.step()
    _tiny.report(step, loss)

if engine.global_rank == 0:
    flops, macs, params = get_model_profile(model=_tiny.model(), input_shape=(8, _tiny.IN),
                                            print_profile=True, detailed=True, as_string=False)
    print(f"get_model_profile flops {flops} macs {macs} params {params}")
    plain = _tiny.model()
    prof = FlopsProfiler(plain)
    prof.start_profile()
    plain(torch.randn(8, _tiny.IN))
    prof.stop_profile()
    print(f"FlopsProfiler flops {prof.get_total_flops()} macs {prof.get_total_macs()} "
          f"params {prof.get_total_params()}")
    prof.print_model_profile(profile_step=1)
    prof.end_profile()
