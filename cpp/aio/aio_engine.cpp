// Async file I/O engine: see aio_engine.h for the design.
#include "aio_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#if defined(__linux__) && __has_include(<linux/aio_abi.h>) && defined(__NR_io_submit) && \
    !defined(DSLAUNCH_AIO_NO_KERNEL_AIO)
#include <linux/aio_abi.h>
#define DSAIO_HAVE_KERNEL_AIO 1
#else
#define DSAIO_HAVE_KERNEL_AIO 0
#endif

namespace dsaio {

namespace {

std::string errno_text(int err) { return std::string(strerror(err)); }

// Moves n bytes between p and fd at off, looping over short transfers. "" on success.
std::string rw_full(int fd, bool read, char* p, int64_t n, int64_t off) {
  while (n > 0) {
    ssize_t r = read ? ::pread(fd, p, static_cast<size_t>(n), off)
                     : ::pwrite(fd, p, static_cast<size_t>(n), off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return (read ? "pread: " : "pwrite: ") + errno_text(errno);
    }
    if (r == 0) return "unexpected end of file";
    p += r;
    n -= r;
    off += r;
  }
  return "";
}

#if DSAIO_HAVE_KERNEL_AIO
long sys_io_setup(unsigned nr, aio_context_t* ctx) { return syscall(__NR_io_setup, nr, ctx); }
long sys_io_destroy(aio_context_t ctx) { return syscall(__NR_io_destroy, ctx); }
long sys_io_submit(aio_context_t ctx, long n, struct iocb** cbs) {
  return syscall(__NR_io_submit, ctx, n, cbs);
}
long sys_io_getevents(aio_context_t ctx, long min_nr, long max_nr, struct io_event* ev) {
  return syscall(__NR_io_getevents, ctx, min_nr, max_nr, ev, nullptr);
}
#endif

}  // namespace

void Op::fail(const std::string& msg) {
  std::lock_guard<std::mutex> lk(m);
  if (error.empty()) error = path + ": " + msg;
}

// -------------------------------------------------------------------------------------------------
// construction

Handle::Handle(const Config& cfg) : cfg_(cfg) {
  if (cfg_.block_size < kAlign) cfg_.block_size = kAlign;
  cfg_.block_size = (cfg_.block_size + kAlign - 1) / kAlign * kAlign;
  cfg_.queue_depth = std::max(1, cfg_.queue_depth);
  cfg_.threads = std::max(1, cfg_.threads);
  const std::string& want = cfg_.backend;
  if (want != "auto" && want != "linux-aio" && want != "threads")
    throw std::invalid_argument("unknown backend '" + want + "' (auto, linux-aio, threads)");
  for (int i = 0; i < cfg_.threads; ++i) workers_.emplace_back(new Worker());
  backend_ = "threads";
  if (want == "threads") {
    backend_note_ = "requested";
  } else {
#if DSAIO_HAVE_KERNEL_AIO
    std::string err;
    for (auto& w : workers_) {
      aio_context_t ctx = 0;
      if (sys_io_setup(static_cast<unsigned>(cfg_.queue_depth), &ctx) != 0) {
        err = "io_setup(" + std::to_string(cfg_.queue_depth) + "): " + errno_text(errno);
        break;
      }
      w->aio_ctx = ctx;
    }
    if (err.empty()) {
      backend_ = "linux-aio";
    } else {
      for (auto& w : workers_)
        if (w->aio_ctx) sys_io_destroy(w->aio_ctx), w->aio_ctx = 0;
      if (want == "linux-aio") throw std::runtime_error(err);
      backend_note_ = err + "; using a thread pool with pread/pwrite";
    }
#else
    if (want == "linux-aio")
      throw std::runtime_error("kernel AIO not compiled in (no <linux/aio_abi.h> at build time)");
    backend_note_ = "kernel AIO not compiled in (no <linux/aio_abi.h> at build time)";
#endif
  }
  for (auto& w : workers_) {
    Worker* wp = w.get();
    wp->thread = std::thread([this, wp] { run_worker(wp); });
  }
}

Handle::~Handle() {
  std::string ignored;
  wait_all(&ignored);
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lk(w->m);
      stopping_ = true;
    }
    w->cv.notify_all();
  }
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
#if DSAIO_HAVE_KERNEL_AIO
    if (w->aio_ctx) sys_io_destroy(w->aio_ctx);
#endif
    for (char* b : w->bounce) std::free(b);
  }
}

// -------------------------------------------------------------------------------------------------
// submit / wait

int64_t Handle::submit(bool read, char* buf, int64_t nbytes, const std::string& path,
                       int64_t offset) {
  if (nbytes < 0 || offset < 0) throw std::invalid_argument("negative size or offset");
  auto op = std::make_shared<Op>();
  op->read = read;
  op->buf = buf;
  op->nbytes = nbytes;
  op->offset = offset;
  op->path = path;
  if (read) {
    op->fd_buf = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (op->fd_buf < 0) throw std::runtime_error(path + ": cannot open for reading: " + errno_text(errno));
    struct stat st;
    if (fstat(op->fd_buf, &st) == 0 && st.st_size < offset + nbytes) {
      ::close(op->fd_buf);
      throw std::runtime_error(path + ": holds " + std::to_string(st.st_size) + " bytes, cannot read " +
                               std::to_string(nbytes) + " at offset " + std::to_string(offset));
    }
  } else {
    op->fd_buf = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (op->fd_buf < 0) throw std::runtime_error(path + ": cannot open for writing: " + errno_text(errno));
  }
  const int64_t aligned = nbytes / kAlign * kAlign;
  if (cfg_.use_direct && offset % kAlign == 0 && aligned > 0) {
    op->fd_direct = ::open(path.c_str(), (read ? O_RDONLY : O_WRONLY) | O_DIRECT | O_CLOEXEC);
    // EINVAL: the file system refuses O_DIRECT -> buffered for this op (counted in stats).
  }
  const bool direct = op->fd_direct >= 0;
  op->bounce = direct && (reinterpret_cast<uintptr_t>(buf) % kAlign) != 0;

  // Split [0, region) into up to `threads` page-aligned chunks; the unaligned tail of a direct op
  // is one more (buffered) chunk.
  std::vector<Chunk> chunks;
  const int64_t region = direct ? aligned : nbytes;
  const int64_t T = cfg_.threads;
  int64_t per = (region + T - 1) / T;
  per = std::max<int64_t>(kAlign, (per + kAlign - 1) / kAlign * kAlign);
  for (int64_t b = 0; b < region; b += per) chunks.push_back({op, b, std::min(b + per, region), direct});
  if (direct && aligned < nbytes) chunks.push_back({op, aligned, nbytes, false});

  op->remaining = static_cast<int>(chunks.size());
  {
    std::lock_guard<std::mutex> lk(ops_m_);
    op->id = next_id_++;
    ops_[op->id] = op;
  }
  if (chunks.empty()) {
    op->remaining = 1;
    finish_chunk(op);
    return op->id;
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    Worker* w = workers_[i % workers_.size()].get();
    {
      std::lock_guard<std::mutex> lk(w->m);
      w->queue.push_back(chunks[i]);
    }
    w->cv.notify_one();
  }
  return op->id;
}

std::string Handle::wait_op(int64_t id) {
  std::shared_ptr<Op> op;
  {
    std::lock_guard<std::mutex> lk(ops_m_);
    auto it = ops_.find(id);
    if (it == ops_.end()) return "no pending op with id " + std::to_string(id);
    op = it->second;
  }
  {
    std::unique_lock<std::mutex> lk(op->m);
    op->cv.wait(lk, [&] { return op->done; });
  }
  std::lock_guard<std::mutex> lk(ops_m_);
  ops_.erase(id);
  return op->error;
}

int64_t Handle::wait_all(std::string* first_error) {
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lk(ops_m_);
    for (auto& kv : ops_) ids.push_back(kv.first);
  }
  int64_t n = 0;
  for (int64_t id : ids) {
    std::string err = wait_op(id);
    ++n;
    if (!err.empty() && first_error->empty()) *first_error = err;
  }
  return n;
}

int64_t Handle::pending() const {
  std::lock_guard<std::mutex> lk(ops_m_);
  return static_cast<int64_t>(ops_.size());
}

void Handle::finish_chunk(const std::shared_ptr<Op>& op) {
  if (--op->remaining > 0) return;
  if (op->fd_direct >= 0) ::close(op->fd_direct);
  if (op->fd_buf >= 0) ::close(op->fd_buf);
  op->fd_direct = op->fd_buf = -1;
  stats.ops++;
  {
    std::lock_guard<std::mutex> lk(op->m);
    op->done = true;
  }
  op->cv.notify_all();
}

// -------------------------------------------------------------------------------------------------
// workers

void Handle::run_worker(Worker* w) {
  for (;;) {
    Chunk c;
    {
      std::unique_lock<std::mutex> lk(w->m);
      w->cv.wait(lk, [&] { return !w->queue.empty() || stopping_; });
      if (w->queue.empty()) return;
      c = std::move(w->queue.front());
      w->queue.pop_front();
    }
    try {
      run_chunk(w, c);
    } catch (const std::exception& e) {
      c.op->fail(e.what());
    }
    finish_chunk(c.op);
  }
}

char* Handle::bounce_buffer(Worker* w, int slot) {
  if (w->bounce.size() <= static_cast<size_t>(slot)) w->bounce.resize(slot + 1, nullptr);
  if (!w->bounce[slot]) {
    void* p = nullptr;
    if (posix_memalign(&p, kAlign, static_cast<size_t>(cfg_.block_size)) != 0) throw std::bad_alloc();
    w->bounce[slot] = static_cast<char*>(p);
  }
  return w->bounce[slot];
}

void Handle::run_chunk(Worker* w, const Chunk& c) {
  Op& op = *c.op;
  if (!c.direct) {
    std::string err = rw_full(op.fd_buf, op.read, op.buf + c.begin, c.end - c.begin, op.offset + c.begin);
    if (!err.empty()) return op.fail(err);
    stats.buffered_bytes += c.end - c.begin;
    stats.requests++;
    return;
  }
  if (backend_ == "linux-aio")
    run_chunk_aio(w, c);
  else
    run_chunk_sync(w, c);
}

// One block synchronously on the O_DIRECT descriptor; a file system that accepted O_DIRECT at
// open() but refuses the transfer (EINVAL) gets it through the page cache instead.
static std::string direct_block(Op& op, Stats& stats, char* p, int64_t len, int64_t off) {
  std::string err = rw_full(op.fd_direct, op.read, p, len, off);
  if (err.empty()) {
    stats.direct_bytes += len;
    return err;
  }
  err = rw_full(op.fd_buf, op.read, p, len, off);
  if (err.empty()) stats.buffered_bytes += len;
  return err;
}

void Handle::run_chunk_sync(Worker* w, const Chunk& c) {
  Op& op = *c.op;
  for (int64_t pos = c.begin; pos < c.end; pos += cfg_.block_size) {
    const int64_t len = std::min(cfg_.block_size, c.end - pos);
    char* p = op.bounce ? bounce_buffer(w, 0) : op.buf + pos;
    if (!op.read && op.bounce) memcpy(p, op.buf + pos, len);
    std::string err = direct_block(op, stats, p, len, op.offset + pos);
    stats.requests++;
    if (!err.empty()) return op.fail(err);
    if (op.read && op.bounce) memcpy(op.buf + pos, p, len), stats.bounce_bytes += len;
    if (!op.read && op.bounce) stats.bounce_bytes += len;
  }
}

void Handle::run_chunk_aio(Worker* w, const Chunk& c) {
#if DSAIO_HAVE_KERNEL_AIO
  Op& op = *c.op;
  const int qd = cfg_.queue_depth;
  const auto ctx = static_cast<aio_context_t>(w->aio_ctx);
  std::vector<struct iocb> cbs(qd);
  std::vector<struct io_event> events(qd);
  std::vector<int64_t> pos(qd), len(qd);
  std::vector<int> free_slots;
  for (int s = qd - 1; s >= 0; --s) free_slots.push_back(s);
  std::vector<struct iocb*> batch;
  batch.reserve(qd);
  int64_t next = c.begin;
  int inflight = 0;
  bool failed = false;

  auto slot_ptr = [&](int s) { return op.bounce ? bounce_buffer(w, s) : op.buf + pos[s]; };
  // A slot's data has arrived (read) or left (write): copy out of the bounce buffer, free it.
  auto complete = [&](int s) {
    if (op.bounce) {
      if (op.read) memcpy(op.buf + pos[s], slot_ptr(s), len[s]);
      stats.bounce_bytes += len[s];
    }
    free_slots.push_back(s);
  };
  // Do a slot synchronously (submission refused, or a short / refused transfer).
  auto do_sync = [&](int s, int64_t done_bytes) {
    std::string err = direct_block(op, stats, slot_ptr(s) + done_bytes, len[s] - done_bytes,
                                   op.offset + pos[s] + done_bytes);
    if (!err.empty()) {
      op.fail(err);
      failed = true;
    }
  };

  while ((!failed && next < c.end) || inflight > 0) {
    if (!failed && next < c.end && (cfg_.overlap_events || inflight == 0)) {
      batch.clear();
      while (!free_slots.empty() && next < c.end) {
        const int s = free_slots.back();
        free_slots.pop_back();
        pos[s] = next;
        len[s] = std::min(cfg_.block_size, c.end - next);
        next += len[s];
        char* p = slot_ptr(s);
        if (!op.read && op.bounce) memcpy(p, op.buf + pos[s], len[s]);
        memset(&cbs[s], 0, sizeof(cbs[s]));
        cbs[s].aio_data = static_cast<uint64_t>(s);
        cbs[s].aio_lio_opcode = op.read ? IOCB_CMD_PREAD : IOCB_CMD_PWRITE;
        cbs[s].aio_fildes = static_cast<uint32_t>(op.fd_direct);
        cbs[s].aio_buf = reinterpret_cast<uint64_t>(p);
        cbs[s].aio_nbytes = static_cast<uint64_t>(len[s]);
        cbs[s].aio_offset = op.offset + pos[s];
        batch.push_back(&cbs[s]);
      }
      size_t sent = 0;
      while (sent < batch.size()) {
        const long n = cfg_.single_submit ? 1 : static_cast<long>(batch.size() - sent);
        const long r = sys_io_submit(ctx, n, batch.data() + sent);
        if (r > 0) {
          sent += static_cast<size_t>(r);
          inflight += static_cast<int>(r);
          stats.requests += r;
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        // Refused (EAGAIN: out of AIO resources, EINVAL: ...): do this one synchronously.
        const int s = static_cast<int>(batch[sent]->aio_data);
        if (!failed) do_sync(s, 0);
        stats.requests++;
        complete(s);
        ++sent;
      }
    }
    if (inflight == 0) continue;
    const long min_nr = cfg_.overlap_events ? 1 : inflight;
    const long got = sys_io_getevents(ctx, min_nr, qd, events.data());
    if (got < 0) {
      if (errno == EINTR) continue;
      // Cannot reap: the kernel may still write into our buffers, so this is unrecoverable.
      op.fail("io_getevents: " + errno_text(errno));
      std::abort();
    }
    for (long i = 0; i < got; ++i) {
      const int s = static_cast<int>(events[i].data);
      const int64_t res = events[i].res;
      --inflight;
      if (res < 0) {
        if (!failed) do_sync(s, 0);  // e.g. EINVAL from a file system half-supporting O_DIRECT
      } else {
        stats.direct_bytes += std::min<int64_t>(res, len[s]);
        if (res < len[s] && !failed) do_sync(s, res);  // short transfer: finish it buffered
      }
      complete(s);
    }
  }
#else
  run_chunk_sync(w, c);
#endif
}

// -------------------------------------------------------------------------------------------------

bool Handle::probe_direct(const std::string& dir, std::string* why) {
  const std::string path = dir + "/.dslaunch-odirect-probe." + std::to_string(getpid()) + "." +
                           std::to_string(reinterpret_cast<uintptr_t>(why) & 0xffff);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    *why = err == EINVAL ? "the file system refuses O_DIRECT" : "open(O_DIRECT): " + errno_text(err);
    ::unlink(path.c_str());
    return false;
  }
  void* p = nullptr;
  bool ok = false;
  if (posix_memalign(&p, kAlign, kAlign) == 0) {
    memset(p, 0, kAlign);
    const ssize_t r = ::pwrite(fd, p, kAlign, 0);
    ok = r == kAlign;
    if (!ok) *why = "O_DIRECT write failed: " + errno_text(errno);
    std::free(p);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

}  // namespace dsaio
