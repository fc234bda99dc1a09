"""Async file I/O handle (DeepNVMe's ``aio_handle``) over the compiled op ``async_io``.

    from dslaunch.nvme.aio import AsyncIOHandle
    h = AsyncIOHandle(block_size=1 << 20, queue_depth=8, single_submit=False,
                      overlap_events=True, intra_op_parallelism=4)
    buf = h.new_cpu_locked_tensor(n, torch.float32)     # page-aligned (pinned where CUDA exists)
    h.sync_pwrite(buf, "/nvme/x.bin")                   # -> 1 (ops completed)
    h.async_pread(buf, "/nvme/x.bin"); ...; h.wait()    # -> number of ops completed

The engine (``cpp/aio``) moves each op in ``block_size`` requests with up to ``queue_depth`` in
flight, split over ``intra_op_parallelism`` threads, using kernel AIO (``h.backend ==
"linux-aio"``) or a pread/pwrite thread pool (``"threads"``; ``h.backend_note`` says why).
O_DIRECT is used where the file system accepts it; elsewhere, and for the part of a size past the
last 4 KiB boundary, buffered I/O. ``h.stats()`` counts the bytes each way.
"""

from __future__ import annotations

import os

from dslaunch.nvme import pinned

OP_NAME = "async_io"
ALIGN = 4096
BACKENDS = ("auto", "linux-aio", "threads")
DEFAULTS = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
            "single_submit": False, "overlap_events": True}


class AioUnavailable(RuntimeError):
    """The async_io op cannot be built or loaded here."""


def _register_op() -> None:
    """Make sure the builder's op table knows async_io (the table may predate this op)."""
    from dslaunch.kernels.ops import OPS, OpSpec

    if OP_NAME not in OPS:
        OPS[OP_NAME] = OpSpec(OP_NAME, "cpu", ("aio/aio_engine.cpp", "aio/aio_py.cpp"),
                              "async file I/O (kernel AIO / thread pool, O_DIRECT)")


def load_engine():
    """The compiled engine module (built through dslaunch.kernels on first use)."""
    _register_op()
    from dslaunch.kernels import builder

    try:
        return builder.load(OP_NAME)
    except (builder.OpUnavailable, builder.BuildError) as exc:
        raise AioUnavailable(f"async_io op unavailable: {exc}") from None


def probe_direct(directory) -> tuple[bool, str]:
    """(True, "") when O_DIRECT works for files in `directory`, else (False, why)."""
    return load_engine().probe_direct(os.fspath(directory))


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _path(filename) -> str:
    """A path, or an open file descriptor's (DeepSpeed's handles take an fd in async_pwrite)."""
    if isinstance(filename, int) and not isinstance(filename, bool):
        return f"/proc/self/fd/{filename}"
    return os.fspath(filename)


def _async_keyword(async_op, kwargs: dict, what: str) -> bool:
    """DeepSpeed names the flag ``async`` (a keyword in Python: ``**{"async": True}``)."""
    if "async" in kwargs:
        async_op = kwargs.pop("async")
    if kwargs:
        raise TypeError(f"{what}() got unexpected keyword arguments {sorted(kwargs)}")
    return bool(async_op)


def _validate(is_read: bool, tensor, path: str, offset: int) -> None:
    """The bytes of `tensor` equal the file's at `offset` (read back with plain os.pread)."""
    nbytes = tensor.numel() * tensor.element_size()
    fd = os.open(path, os.O_RDONLY)
    try:
        on_file = os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)
    import torch

    ours = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    if on_file != ours:
        first = next((i for i, (a, b) in enumerate(zip(on_file, ours)) if a != b),
                     min(len(on_file), len(ours)))
        raise OSError(f"validate: {'read' if is_read else 'write'} of {nbytes} bytes at offset "
                      f"{offset} of {path}: the buffer and the file differ from byte {first} on")


def _tensor_span(tensor, what: str) -> tuple[int, int]:
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: tensor must be on the CPU, not {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: tensor must be contiguous")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


class AsyncIOHandle:
    """DeepNVMe-style async I/O handle. One handle may have many async ops in flight; `wait()`
    collects them. Tensors of pending ops are kept alive by the handle until waited for."""

    def __init__(self, block_size: int = 1048576, queue_depth: int = 8, single_submit: bool = False,
                 overlap_events: bool = True, intra_op_parallelism: int = 1, *,
                 use_direct: bool = True, backend: str | None = None):
        _check_int("block_size", block_size, ALIGN)
        if block_size % ALIGN:
            raise ValueError(f"block_size must be a multiple of {ALIGN}, got {block_size}")
        _check_int("queue_depth", queue_depth, 1)
        _check_int("intra_op_parallelism", intra_op_parallelism, 1)
        backend = backend or os.environ.get("DSLAUNCH_AIO_BACKEND", "auto")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self._eng = load_engine()
        self.block_size, self.queue_depth = block_size, queue_depth
        self.single_submit, self.overlap_events = bool(single_submit), bool(overlap_events)
        self.intra_op_parallelism = intra_op_parallelism
        self._h = self._eng.new_handle(block_size, queue_depth, self.single_submit,
                                       self.overlap_events, intra_op_parallelism, bool(use_direct),
                                       backend)
        self.backend, self.backend_note = self._eng.backend(self._h)
        self._pending: dict[int, object] = {}   # op id -> tensor kept alive
        self._validate: dict[int, tuple] = {}   # op id -> what pread/pwrite(validate=True) checks
        self._owned: set[int] = set()           # data_ptrs of this handle's locked tensors

    # DeepSpeed's getters
    def get_block_size(self): return self.block_size
    def get_queue_depth(self): return self.queue_depth
    def get_single_submit(self): return self.single_submit
    def get_overlap_events(self): return self.overlap_events
    def get_intra_op_parallelism(self): return self.intra_op_parallelism
    get_thread_count = get_intra_op_parallelism

    def config(self) -> dict:
        """This handle's settings as the keys of the config's ``aio`` section."""
        return {"block_size": self.block_size, "queue_depth": self.queue_depth,
                "intra_op_parallelism": self.intra_op_parallelism,
                "single_submit": self.single_submit, "overlap_events": self.overlap_events,
                "use_gds": False}

    # ---- I/O -------------------------------------------------------------------------------------
    # DeepSpeed's argument names (buffer, filename, validate, file_offset); filename may also be
    # an open file descriptor (an int), as DeepSpeed's async_pwrite(buffer, fd) takes.

    def _submit(self, is_read: bool, tensor, path, offset: int, validate: bool = False) -> int:
        ptr, nbytes = _tensor_span(tensor, "pread" if is_read else "pwrite")
        _check_int("file_offset", offset, 0)
        path = _path(path)
        op_id = self._eng.submit(self._h, is_read, ptr, nbytes, path, offset)
        self._pending[op_id] = tensor
        if validate:
            self._validate[op_id] = (is_read, tensor, path, offset)
        return op_id

    def _sync(self, is_read, tensor, path, offset, validate=False) -> int:
        op_id = self._submit(is_read, tensor, path, offset, validate)
        try:
            self._eng.wait_op(self._h, op_id)
        finally:
            self._pending.pop(op_id, None)
        check = self._validate.pop(op_id, None)
        if check:
            _validate(*check)
        return 1

    def sync_pread(self, buffer, filename, file_offset: int = 0) -> int:
        """Read the file range into `buffer` now; returns 1 (ops completed)."""
        return self._sync(True, buffer, filename, file_offset)

    def sync_pwrite(self, buffer, filename, file_offset: int = 0) -> int:
        """Write `buffer` to the file (created if absent, not truncated); returns 1."""
        return self._sync(False, buffer, filename, file_offset)

    def async_pread(self, buffer, filename, file_offset: int = 0) -> int:
        """Start reading into `buffer`; returns 0 at once. Do not touch `buffer` before wait()."""
        self._submit(True, buffer, filename, file_offset)
        return 0

    def async_pwrite(self, buffer, filename, file_offset: int = 0) -> int:
        """Start writing `buffer`; returns 0 at once. Do not modify `buffer` before wait()."""
        self._submit(False, buffer, filename, file_offset)
        return 0

    def pread(self, buffer, filename, validate: bool = False, async_op: bool = False,
              file_offset: int = 0, **kwargs) -> int:
        """sync_pread, or async_pread with ``async_op`` (DeepSpeed's keyword ``async`` too).
        ``validate``: compare what was read with a plain read of the file (at wait() for an async
        op); a difference raises OSError."""
        is_async = _async_keyword(async_op, kwargs, "pread")
        if not is_async:
            return self._sync(True, buffer, filename, file_offset, validate)
        self._submit(True, buffer, filename, file_offset, validate)
        return 0

    def pwrite(self, buffer, filename, validate: bool = False, async_op: bool = False,
               file_offset: int = 0, **kwargs) -> int:
        """sync_pwrite, or async_pwrite with ``async_op`` (``async``); ``validate`` reads the file
        back after the write and compares."""
        is_async = _async_keyword(async_op, kwargs, "pwrite")
        if not is_async:
            return self._sync(False, buffer, filename, file_offset, validate)
        self._submit(False, buffer, filename, file_offset, validate)
        return 0

    def read(self, buffer, filename, validate: bool, file_offset: int = 0) -> int:
        """DeepSpeed's plain synchronous read of ``buffer.nbytes`` bytes at ``file_offset``;
        returns 0 (as DeepSpeed's does). ``validate`` as in pread."""
        self._sync(True, buffer, filename, file_offset, validate)
        return 0

    def write(self, buffer, filename, validate: bool, file_offset: int = 0) -> int:
        """DeepSpeed's plain synchronous write; returns 0. ``validate`` as in pwrite."""
        self._sync(False, buffer, filename, file_offset, validate)
        return 0

    def wait(self) -> int:
        """Block until every async op is done; return how many completed. OSError (after all
        are done) names the first op that failed, or the first validated op whose bytes differ."""
        try:
            done = self._eng.wait_all(self._h)
        finally:
            self._pending.clear()
            checks, self._validate = list(self._validate.values()), {}
        for check in checks:
            _validate(*check)
        return done

    def get_alignment(self) -> int:
        """Bytes that buffers, sizes and offsets align to for O_DIRECT transfers (4096); other
        sizes work too (their tail goes through buffered I/O)."""
        return ALIGN

    def is_pinned(self, buffer) -> bool:
        """Whether `buffer` is pinned (CUDA's allocator) or from new_cpu_locked_tensor (any
        handle's or pin_handle's)."""
        return pinned.is_pinned(buffer)

    def pending(self) -> int:
        return self._eng.pending(self._h)

    def stats(self) -> dict:
        """Bytes moved with O_DIRECT / buffered / through bounce buffers, ops, block requests."""
        return self._eng.stats(self._h)

    def io_mode(self, directory) -> str:
        """How this handle will move aligned data in `directory`: "O_DIRECT" or
        "buffered (<why>)"."""
        ok, why = probe_direct(directory)
        return "O_DIRECT" if ok else f"buffered ({why})"

    # ---- page-aligned (pinned) buffers -----------------------------------------------------------

    def new_cpu_locked_tensor(self, num_elem: int, dtype_or_tensor):
        """A page-aligned CPU tensor of `num_elem` elements (``pinned.py``: pinned where CUDA is
        available, else mlock'ed when RLIMIT_MEMLOCK allows); freed at close() if not before."""
        out = pinned.new_cpu_locked_tensor(num_elem, dtype_or_tensor)
        self._owned.add(out.data_ptr())
        return out

    def free_cpu_locked_tensor(self, tensor) -> bool:
        """Release a tensor from new_cpu_locked_tensor (any handle's); False if it was not one."""
        self._owned.discard(tensor.data_ptr())
        return pinned.free_cpu_locked_tensor(tensor)

    def is_locked(self, tensor) -> bool:
        return pinned.is_locked(tensor)

    # ---- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for pending ops (errors ignored) and stop the worker threads."""
        h, self._h = getattr(self, "_h", None), None
        if h is None:
            return
        try:
            self._eng.wait_all(h)
        except OSError:
            pass
        self._pending.clear()
        for ptr in self._owned:  # munlock what this handle allocated and did not free
            pinned.free_address(ptr)
        self._owned.clear()
        del h  # the capsule's destructor joins the threads

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except TypeError:  # at interpreter exit the module's globals may already be None
            pass

    def __repr__(self):
        return (f"AsyncIOHandle(block_size={self.block_size}, queue_depth={self.queue_depth}, "
                f"single_submit={self.single_submit}, overlap_events={self.overlap_events}, "
                f"intra_op_parallelism={self.intra_op_parallelism}, backend={self.backend!r})")


aio_handle = AsyncIOHandle  # DeepSpeed's spelling

def report_status() -> dict:
    """For ``dslaunch report``: is the op built, which backend a handle gets here. Never compiles:
    an op not built yet is reported as such."""
    _register_op()
    from dslaunch.kernels import builder

    out = {"op": OP_NAME, "built": False, "backend": None, "note": "", "status": ""}
    st = builder.op_status(OP_NAME)
    out["built"], out["status"] = st["built"] or st["loaded"], st["status"]
    if not out["built"]:
        out["note"] = st.get("reason") or "not built yet (python -m dslaunch.kernels.builder --build-all)"
        return out
    try:
        eng = load_engine()
    except AioUnavailable as exc:
        out["note"] = str(exc)
        return out
    kernel = eng.kernel_aio()
    if kernel is True:
        out["backend"] = "linux-aio"
    else:
        out["backend"], out["note"] = "threads", str(kernel)
    return out
