"""DeepSpeed's docs/_tutorials/mixture-of-experts.md: an expert wrapped in
``deepspeed.moe.layer.MoE(hidden_size=84, expert=..., num_experts=..., ep_size=..., k=1)``
between fc2 and fc4 as the tutorial's cifar Net does, the tutorial's ``create_moe_param_groups``
(``deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer``), and the MoE
layer's auxiliary loss added to the training loss. Its ZeRO stage 2 section is in moe.json."""

import _tiny
import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F

args = _tiny.args()
deepspeed.init_distributed()
EXPERTS, EP_WORLD_SIZE = 2, 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(_tiny.IN, 84)
        self.fc2 = nn.Linear(84, 84)
        self.fc3 = nn.Linear(84, 84)
        self.fc3 = deepspeed.moe.layer.MoE(hidden_size=84, expert=self.fc3, num_experts=EXPERTS,
                                           ep_size=EP_WORLD_SIZE, k=1)
        self.fc4 = nn.Linear(84, _tiny.CLASSES)

    def forward(self, x):
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        x, aux, _ = self.fc3(x)
        return self.fc4(x), aux


def create_moe_param_groups(model):
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    parameters = {'params': [p for p in model.parameters()], 'name': 'parameters'}

    return split_params_into_different_moe_groups_for_optimizer(parameters)


torch.manual_seed(0)
net = Net()
parameters = create_moe_param_groups(net)
model_engine, optimizer, trainloader, __ = deepspeed.initialize(
    args=args, model=net, model_parameters=parameters, training_data=_tiny.dataset())
criterion = nn.CrossEntropyLoss()
it = iter(trainloader)
for step in range(args.steps):
    x, y = next(it)
    out, aux = model_engine(x.to(model_engine.device))
    loss = criterion(out, y.to(model_engine.device)) + 0.01 * aux
    model_engine.backward(loss)
    model_engine.step()
    _tiny.report(step, loss)
