"""The process grid: ranks laid out on ``pipe x data x model`` axes (DeepSpeed's
``PipeModelDataParallelTopology`` order: the model (tensor-parallel) axis varies fastest, then
data, then pipe), the process groups of each axis, and the coordinates of any rank. With Ulysses
sequence parallelism a ``sequence`` axis sits between data and model (``pipe x data x sequence x
model``): a sequence group is neighbouring ranks (DeepSpeed's ``parallel_state_sp`` order), and
the ranks that hold the same weights are the sequence x data plane (``sequence_data`` group).

``ProcessTopology`` is pure arithmetic (no torch.distributed): rank <-> coordinates, the lists of
ranks that differ only along one axis. ``ProcessGrid`` creates the torch.distributed groups of a
topology (every rank creates every group, in the same order, as ``new_group`` requires) and
answers Megatron's ``mpu`` questions (``get_data_parallel_group()``, ...), so it can be passed as
``dslaunch.initialize(mpu=grid)``.
"""

from __future__ import annotations

from collections import namedtuple
from itertools import product

import torch.distributed as dist

from dslaunch.engine.comm.collectives import Comm, init_distributed
from dslaunch.engine.comm.membership import job_world_size, join_word
from dslaunch.engine.parallel.tensor_parallel import PlannedGroup


class TopologyError(ValueError):
    """A world size that does not factor into the requested grid."""


class ProcessTopology:
    """Ranks on a row-major grid: the last axis varies fastest."""

    def __init__(self, axes: list, dims: list):
        if len(axes) != len(dims) or len(set(axes)) != len(axes):
            raise TopologyError(f"topology: axes {axes} and dims {dims} do not match")
        for axis, d in zip(axes, dims):
            if int(d) < 1:
                raise TopologyError(f"topology: axis {axis!r} has size {d}; sizes must be >= 1")
        self.axes = list(axes)
        self.dims = [int(d) for d in dims]
        self.Coord = namedtuple("Coord", self.axes)
        self._coords = [self.Coord(*c) for c in product(*(range(d) for d in self.dims))]
        self._rank_of = {c: r for r, c in enumerate(self._coords)}

    def world_size(self) -> int:
        return len(self._coords)

    def get_dim(self, axis: str) -> int:
        return self.dims[self.axes.index(axis)] if axis in self.axes else 1

    def get_coord(self, rank: int):
        if not 0 <= rank < len(self._coords):
            raise TopologyError(f"topology: rank {rank} is outside the grid of "
                                f"{len(self._coords)} ranks")
        return self._coords[rank]

    def get_rank(self, **coord) -> int:
        if set(coord) != set(self.axes):
            raise TopologyError(f"topology: get_rank needs every axis {self.axes}, got "
                                f"{sorted(coord)}")
        return self._rank_of[self.Coord(**coord)]

    def filter_match(self, **coord) -> list:
        """Ranks whose coordinates match every given axis value."""
        return [r for r, c in enumerate(self._coords)
                if all(getattr(c, k) == v for k, v in coord.items())]

    def get_axis_comm_lists(self, axis: str) -> list:
        """One list per group along ``axis``: ranks that share every other coordinate, ordered by
        their ``axis`` coordinate. Empty when ``axis`` is not in the topology."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for fixed in product(*(range(self.get_dim(a)) for a in others)):
            lists.append([self.get_rank(**dict(zip(others, fixed)), **{axis: i})
                          for i in range(self.get_dim(axis))])
        return lists

    def __repr__(self) -> str:
        return "ProcessTopology(" + ", ".join(f"{a}={d}" for a, d in zip(self.axes, self.dims)) + ")"


class PipeModelDataParallelTopology(ProcessTopology):
    """DeepSpeed's 3D order: ``pipe`` slowest, then ``data``, ``model`` fastest (tensor-parallel
    peers are neighbouring ranks, so they land on the same node first)."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])


class PipeDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeDataSequenceModelTopology(ProcessTopology):
    """The 3D order with a sequence-parallel axis between data and model."""

    def __init__(self, num_pp: int, num_dp: int, num_sp: int, num_mp: int):
        super().__init__(axes=["pipe", "data", "sequence", "model"],
                         dims=[num_pp, num_dp, num_sp, num_mp])


def make_topology(world_size: int, pipe: int = 1, model: int = 1,
                  sequence: int = 1) -> ProcessTopology:
    """The topology for ``world_size`` ranks with ``pipe`` stages, ``model``-way tensor
    parallelism and ``sequence``-way sequence parallelism; the data-parallel size is what is
    left. A world size that does not factor is a ``TopologyError`` that says so. Without
    sequence parallelism: the 3D ``PipeModelDataParallelTopology``."""
    pipe, model, world_size = int(pipe or 1), int(model or 1), int(world_size)
    sequence = int(sequence or 1)
    if pipe < 1 or model < 1 or sequence < 1:
        raise TopologyError(f"topology: pipeline stages ({pipe}), tensor-parallel size "
                            f"({model}) and sequence-parallel size ({sequence}) must be >= 1")
    split = pipe * model * sequence
    if world_size % split:
        seq = f" x sequence parallel {sequence}" if sequence > 1 else ""
        raise TopologyError(
            f"topology: world size {world_size} does not factor into pipeline stages {pipe} x "
            f"tensor parallel {model}{seq} x data parallel: {world_size} is not divisible by "
            f"{split}")
    if sequence == 1:
        return PipeModelDataParallelTopology(num_pp=pipe, num_mp=model,
                                             num_dp=world_size // (pipe * model))
    return PipeDataSequenceModelTopology(num_pp=pipe, num_dp=world_size // split,
                                         num_sp=sequence, num_mp=model)


class GroupComm(Comm):
    """``Comm`` of a sub-group whose ``broadcast(src=)`` takes the rank *in the group* (the ZeRO
    strategies broadcast from their group's rank 0, which need not be global rank 0)."""

    def broadcast(self, tensor, src=0, async_op=False):
        if self.group is None:
            return super().broadcast(tensor, src, async_op)
        return self._run("broadcast", self._nbytes(tensor),
                         lambda a: dist.broadcast(tensor, group=self.group, group_src=src,
                                                  async_op=a), async_op)


class ProcessGrid:
    """The process groups of a topology for this rank (``dist`` must be initialised).

    Axes that the topology lacks have size 1 (a group of this rank alone)."""

    # a replacement rank's grid while it builds alone, its groups stand-ins until it joins
    # (engine/recovery/grid.py)
    planned = False

    def __init__(self, topology: ProcessTopology, rank: int | None = None):
        self.topology = topology
        self.global_rank = dist.get_rank() if rank is None else rank
        world = dist.get_world_size()
        if topology.world_size() != world:
            raise TopologyError(f"topology: {topology} holds {topology.world_size()} ranks but "
                                f"the job has {world}")
        self.coord = topology.get_coord(self.global_rank)
        self.make_groups(dist.new_group)

    def make_groups(self, new_group) -> None:
        """Create the process group of every axis with ``new_group(ranks)`` (every rank creates
        every group, in the same order). Called again by in-process recovery on a new world
        (``engine/recovery/grid.py``): the grid object stays, so whoever holds it sees the new
        groups."""
        world = self.topology.world_size()
        self.groups, self.group_ranks = {}, {}
        for axis in ("pipe", "data", "model"):
            lists = self.topology.get_axis_comm_lists(axis) or [[r] for r in range(world)]
            for ranks in lists:  # every rank creates every group, in the same order
                group = new_group(ranks)
                if self.global_rank in ranks:
                    self.groups[axis], self.group_ranks[axis] = group, ranks

        self.stage_id = self._c("pipe")
        self.num_stages = self.topology.get_dim("pipe")
        self.dp_rank, self.dp_world_size = self._c("data"), self.topology.get_dim("data")
        self.tp_rank, self.tp_world_size = self._c("model"), self.topology.get_dim("model")
        self.pipe_group = self.groups["pipe"]
        self.data_group = self.groups["data"]
        self.model_group = self.groups["model"]
        self._dp_comm = None
        self._make_sequence_groups(world, new_group)

    def _make_sequence_groups(self, world: int, new_group) -> None:
        """The sequence axis and the sequence x data plane (the ranks that hold the same
        weights, over which their gradients are reduced). Without a sequence axis: no new
        groups (the sequence group is this rank alone, the plane is the data group)."""
        self.sp_rank, self.sp_world_size = self._c("sequence"), self.topology.get_dim("sequence")
        self.sequence_group = self.sequence_data_group = self._sdp_comm = None
        self.sequence_data_ranks = self.group_ranks["data"]
        if "sequence" not in self.topology.axes:
            self.sequence_data_group = self.data_group
            return
        for ranks in self.topology.get_axis_comm_lists("sequence"):
            group = new_group(ranks)
            if self.global_rank in ranks:
                self.sequence_group, self.group_ranks["sequence"] = group, ranks
        planes: dict = {}
        for rank in range(world):  # the ranks sharing this rank's pipe and model coordinates
            c = self.topology.get_coord(rank)
            planes.setdefault((self._of(c, "pipe"), self._of(c, "model")), []).append(rank)
        for ranks in planes.values():
            group = new_group(ranks)
            if self.global_rank in ranks:
                self.sequence_data_group, self.sequence_data_ranks = group, ranks

    def _of(self, coord, axis):
        return getattr(coord, axis) if axis in self.topology.axes else 0

    def _c(self, axis):
        return getattr(self.coord, axis) if axis in self.topology.axes else 0

    # -- pipeline neighbours -------------------------------------------------------------------
    def stage_to_global(self, stage_id: int) -> int:
        """The global rank of ``stage_id`` with this rank's data and model coordinates."""
        return self.group_ranks["pipe"][stage_id]

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    @property
    def prev_rank(self):
        return None if self.is_first_stage else self.stage_to_global(self.stage_id - 1)

    @property
    def next_rank(self):
        return None if self.is_last_stage else self.stage_to_global(self.stage_id + 1)

    def data_parallel_comm(self) -> GroupComm:
        """The data-parallel ``Comm`` the ZeRO strategy reduces gradients over (one per grid)."""
        if self._dp_comm is None:
            self._dp_comm = GroupComm(self.data_group)
        return self._dp_comm

    def sequence_data_parallel_comm(self) -> GroupComm:
        """The ``Comm`` of the sequence x data plane: with sequence parallelism the weights'
        gradients are averaged (and ZeRO partitions) over it; without, the data-parallel one."""
        if self.sp_world_size == 1:
            return self.data_parallel_comm()
        if self._sdp_comm is None:
            self._sdp_comm = GroupComm(self.sequence_data_group)
        return self._sdp_comm

    # -- Megatron's mpu interface --------------------------------------------------------------
    def get_data_parallel_group(self):
        return self.data_group

    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def get_data_parallel_world_size(self) -> int:
        return self.dp_world_size

    def get_model_parallel_group(self):
        return self.model_group

    def get_model_parallel_rank(self) -> int:
        return self.tp_rank

    def get_model_parallel_world_size(self) -> int:
        return self.tp_world_size

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_pipe_parallel_group(self):
        return self.pipe_group

    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self.num_stages

    get_pipeline_model_parallel_group = get_pipe_parallel_group
    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_sequence_parallel_group(self):
        if self.sequence_group is None:  # no sequence axis: this rank alone
            from dslaunch.engine.parallel.groups import self_group

            return self_group()
        return self.sequence_group

    def get_sequence_parallel_rank(self) -> int:
        return self.sp_rank

    def get_sequence_parallel_world_size(self) -> int:
        return self.sp_world_size

    def get_sequence_data_parallel_group(self):
        return self.sequence_data_group

    def get_sequence_data_parallel_rank(self) -> int:
        return self.sequence_data_ranks.index(self.global_rank)

    def get_sequence_data_parallel_world_size(self) -> int:
        return len(self.sequence_data_ranks)


_GRIDS: dict = {}


def get_grid(topology: ProcessTopology) -> ProcessGrid:
    """The grid of ``topology``, created once per process (``new_group`` is collective, so a
    second PipelineModule or TP helper on the same layout reuses the groups)."""
    key = (tuple(topology.axes), tuple(topology.dims))
    if key not in _GRIDS:
        word = join_word()  # a replacement rank of an in-process recovery, built alone
        if word and dist.get_world_size() != topology.world_size():
            _GRIDS[key] = planned_grid(topology, word)
        else:
            _GRIDS[key] = ProcessGrid(topology)
    return _GRIDS[key]


def build_grid(pipe: int = 1, model: int = 1, sequence: int = 1) -> ProcessGrid:
    """Initialise torch.distributed if needed and return the grid for this job's world size
    (a replacement rank built alone: the world it joins)."""
    init_distributed()
    return get_grid(make_topology(job_world_size(), pipe=pipe, model=model, sequence=sequence))


# A replacement rank of an in-process recovery builds its engine alone, before it joins the
# survivors' group (engine/recovery/grid.py makes the real groups once it has joined).
def stand_ins(rank: int):
    """``new_group`` for a rank that cannot make groups yet: a ``PlannedGroup`` for each group
    that holds ``rank`` (None for the others, as ``dist.new_group`` answers a non-member)."""
    return lambda ranks: PlannedGroup(ranks, rank) if rank in ranks else None


def planned_grid(topology, word: dict) -> ProcessGrid:
    """A replacement rank's grid while it is alone: the coordinates of its rank in the world it
    joins, stand-in groups, and for the data axis (and the sequence x data plane) the one-rank
    world, which the engine's ``Comm`` and ZeRO strategy reduce over until it joins."""
    rank = int(word["rank"])
    grid = ProcessGrid.__new__(ProcessGrid)
    grid.topology = topology
    grid.global_rank, grid.coord = rank, topology.get_coord(rank)
    grid.planned = True
    grid.make_groups(stand_ins(rank))
    alone = dist.group.WORLD
    grid.groups["data"] = grid.data_group = grid.sequence_data_group = alone
    return grid
