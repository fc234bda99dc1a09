// Async file I/O engine behind dslaunch.nvme.aio (torch-free, no Python).
//
// One Handle owns `threads` worker threads. Each read/write op (one buffer <-> one file range) is
// split into page-aligned chunks, one per worker; a worker moves its chunk in `block_size` pieces
// with up to `queue_depth` requests in flight:
//   * backend "linux-aio": kernel AIO (io_setup/io_submit/io_getevents system calls, the interface
//     libaio wraps; one AIO context per worker). Compiled in where <linux/aio_abi.h> exists.
//   * backend "threads":   plain pread/pwrite per block (queue depth 1 per worker). Used when
//     kernel AIO is not compiled in, when io_setup fails (e.g. fs.aio-max-nr exhausted), or when
//     asked for.
// O_DIRECT is used where the file system accepts it (open() with O_DIRECT succeeds) and the file
// offset is 4 KiB aligned; otherwise, and for the unaligned tail of a size, buffered I/O. A buffer
// that is not 4 KiB aligned goes through per-request aligned bounce buffers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dsaio {

constexpr int64_t kAlign = 4096;

struct Config {
  int64_t block_size = 1 << 20;
  int queue_depth = 8;
  bool single_submit = false;
  bool overlap_events = true;
  int threads = 1;
  bool use_direct = true;     // try O_DIRECT (false: always buffered)
  std::string backend = "auto";  // "auto" | "linux-aio" | "threads"
};

struct Stats {
  std::atomic<int64_t> direct_bytes{0};    // moved with O_DIRECT
  std::atomic<int64_t> buffered_bytes{0};  // moved through the page cache
  std::atomic<int64_t> bounce_bytes{0};    // O_DIRECT bytes staged through a bounce buffer
  std::atomic<int64_t> ops{0};             // ops completed (ok or failed)
  std::atomic<int64_t> requests{0};        // block requests issued
};

struct Op {
  int64_t id = 0;
  bool read = true;
  char* buf = nullptr;
  int64_t nbytes = 0;
  int64_t offset = 0;
  std::string path;
  int fd_direct = -1;  // O_DIRECT descriptor, -1 when direct I/O is not used
  int fd_buf = -1;     // buffered descriptor (tails, fallback)
  bool bounce = false;
  std::atomic<int> remaining{0};
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // first error, empty if none
  void fail(const std::string& msg);
};

struct Chunk {
  std::shared_ptr<Op> op;
  int64_t begin = 0, end = 0;  // byte range inside the op's buffer
  bool direct = false;
};

class Handle {
 public:
  explicit Handle(const Config& cfg);
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  // Opens the file and queues the op; throws std::runtime_error (message names the path) when the
  // file cannot be opened / is too short. Returns the op id.
  int64_t submit(bool read, char* buf, int64_t nbytes, const std::string& path, int64_t offset);
  // Blocks until op `id` is done; returns its error ("" = ok). Forgets the op.
  std::string wait_op(int64_t id);
  // Blocks until every submitted op is done; returns how many completed; *first_error gets the
  // first failure ("" if none). Forgets them.
  int64_t wait_all(std::string* first_error);
  int64_t pending() const;
  // Would O_DIRECT be used for files in `dir`? (creates and removes a probe file)
  static bool probe_direct(const std::string& dir, std::string* why);

  const Config& config() const { return cfg_; }
  const std::string& backend() const { return backend_; }
  const std::string& backend_note() const { return backend_note_; }
  Stats stats;

 private:
  struct Worker {
    std::thread thread;
    std::deque<Chunk> queue;
    std::mutex m;
    std::condition_variable cv;
    uint64_t aio_ctx = 0;  // aio_context_t
    std::vector<char*> bounce;  // queue_depth aligned buffers of block_size, lazily allocated
  };
  void run_worker(Worker* w);
  void run_chunk(Worker* w, const Chunk& c);
  void run_chunk_sync(Worker* w, const Chunk& c);
  void run_chunk_aio(Worker* w, const Chunk& c);
  char* bounce_buffer(Worker* w, int slot);
  void finish_chunk(const std::shared_ptr<Op>& op);

  Config cfg_;
  std::string backend_;
  std::string backend_note_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex ops_m_;
  std::map<int64_t, std::shared_ptr<Op>> ops_;
  int64_t next_id_ = 1;
};

}  // namespace dsaio
