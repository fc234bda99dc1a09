#!/usr/bin/env python3
# A test fixture: DeepSpeedExamples' training/pipeline_parallelism/train.py
# (deepspeedai/DeepSpeedExamples, Apache License 2.0, Copyright (c) Microsoft Corporation) as a
# user ports it to dslaunch. The code below is the original's, in its order (line ends LF),
# except for these edits, each also applied by benchmarks/conformance.py when it runs the
# original:
#
# - the port itself: `import deepspeed` -> `import dslaunch as deepspeed`, and each
#   `from deepspeed.X import Y` -> `from dslaunch.X import Y`;
# - no torchvision (not installed, and no download); CPU time (the tests run 60 + 20 steps):
#   AlexNet is a stand-in with torchvision's AlexNet layout (features, avgpool, classifier with
#   its dropouts) at 1/8 of its width, so that join_layers works on it unchanged, and the images
#   are 64x64 instead of 224x224; vgg19 is unused;
# - the stand-in AlexNet and the synthetic dataset, defined after the imports;
# - no download: cifar_trainset returns 64 seeded synthetic images of 10 learnable classes
#   instead of CIFAR-10 (its barriers stay);
# - no download: the transforms belong to the torchvision dataset;
# - cpu: no CUDA device to select.

import os
import argparse

import torch
import torch.distributed as dist

import torch.nn as nn

import dslaunch as deepspeed
from dslaunch.pipe import PipelineModule
from dslaunch.utils import RepeatingLoader


class AlexNet(nn.Module):  # test edit (CPU time): torchvision's AlexNet layout, narrow
    """channels / 8, hidden 4096 -> 128; the layer list join_layers reads is the same."""

    def __init__(self, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(8, 24, kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(24, 48, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(48, 32, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(32 * 6 * 6, 128), nn.ReLU(inplace=True),
            nn.Dropout(p=dropout), nn.Linear(128, 128), nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def _synthetic_cifar10_64(n=64):  # test edit (no download, CPU time): 64x64 images
    g = torch.Generator().manual_seed(1234)
    patterns = torch.rand(10, 3, 64, 64, generator=g) * 2 - 1
    labels = torch.arange(n) % 10
    images = 0.6 * patterns[labels] + 0.4 * torch.randn(n, 3, 64, 64, generator=g)
    return torch.utils.data.TensorDataset(images, labels)


def cifar_trainset(local_rank, dl_path='/tmp/cifar10-data'):

    # Ensure only one rank downloads.
    # Note: if the download path is not on a shared filesytem, remove the semaphore
    # and switch to args.local_rank
    dist.barrier()
    if local_rank != 0:
        dist.barrier()
    trainset = _synthetic_cifar10_64()
    if local_rank == 0:
        dist.barrier()
    return trainset


def get_args():
    parser = argparse.ArgumentParser(description='CIFAR')
    parser.add_argument('--local_rank',
                        type=int,
                        default=-1,
                        help='local rank passed from distributed launcher')
    parser.add_argument('-s',
                        '--steps',
                        type=int,
                        default=100,
                        help='quit after this many steps')
    parser.add_argument('-p',
                        '--pipeline-parallel-size',
                        type=int,
                        default=2,
                        help='pipeline parallelism')
    parser.add_argument('--backend',
                        type=str,
                        default='nccl',
                        help='distributed backend')
    parser.add_argument('--seed', type=int, default=1138, help='PRNG seed')
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    return args


def train_base(args):
    torch.manual_seed(args.seed)

    # VGG also works :-)
    #net = vgg19(num_classes=10)
    net = AlexNet(num_classes=10)

    trainset = cifar_trainset(args.local_rank)

    engine, _, dataloader, __ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset)

    dataloader = RepeatingLoader(dataloader)
    data_iter = iter(dataloader)

    rank = dist.get_rank()
    gas = engine.gradient_accumulation_steps()

    criterion = torch.nn.CrossEntropyLoss()

    total_steps = args.steps * engine.gradient_accumulation_steps()
    step = 0
    for micro_step in range(total_steps):
        batch = next(data_iter)
        inputs = batch[0].to(engine.device)
        labels = batch[1].to(engine.device)

        outputs = engine(inputs)
        loss = criterion(outputs, labels)
        engine.backward(loss)
        engine.step()

        if micro_step % engine.gradient_accumulation_steps() == 0:
            step += 1
            if rank == 0 and (step % 10 == 0):
                print(f'step: {step:3d} / {args.steps:3d} loss: {loss}')



def join_layers(vision_model):
    layers = [
        *vision_model.features,
        vision_model.avgpool,
        lambda x: torch.flatten(x, 1),
        *vision_model.classifier,
    ]
    return layers


def train_pipe(args, part='parameters'):
    torch.manual_seed(args.seed)
    deepspeed.runtime.utils.set_random_seed(args.seed)

    #
    # Build the model
    #

    # VGG also works :-)
    #net = vgg19(num_classes=10)
    net = AlexNet(num_classes=10)
    net = PipelineModule(layers=join_layers(net),
                         loss_fn=torch.nn.CrossEntropyLoss(),
                         num_stages=args.pipeline_parallel_size,
                         partition_method=part,
                         activation_checkpoint_interval=0)

    trainset = cifar_trainset(args.local_rank)

    engine, _, _, _ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset)

    for step in range(args.steps):
        loss = engine.train_batch()


if __name__ == '__main__':
    args = get_args()

    deepspeed.init_distributed(dist_backend=args.backend)
    args.local_rank = int(os.environ['LOCAL_RANK'])
    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)

    if args.pipeline_parallel_size == 0:
        train_base(args)
    else:
        train_pipe(args)
