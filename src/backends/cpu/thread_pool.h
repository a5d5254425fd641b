#pragma once
// A small persistent pool: the calling thread plus workers that sleep between jobs. One job at a time.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace npusim::cpu {

class ThreadPool {
 public:
  // `threads` counts the caller; 0 means one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end, worker) over [0, count) split into at most size() contiguous pieces, each a multiple of
  // `grain` (except the last); worker is in [0, size()) and distinct per piece. `fn` must not throw.
  template <typename Fn>
  void parallel_for(int64_t count, int64_t grain, const Fn& fn) {
    if (count <= 0) return;
    if (grain < 1) grain = 1;
    const int64_t grains = (count + grain - 1) / grain;
    const int64_t pieces = std::min<int64_t>(size(), grains);
    if (pieces <= 1) {
      fn(int64_t{0}, count, 0);
      return;
    }
    const int64_t per_piece = (grains + pieces - 1) / pieces * grain;
    run_job([](const void* context, int64_t begin, int64_t end,
               int worker) { (*static_cast<const Fn*>(context))(begin, end, worker); },
            &fn, count, per_piece);
  }

 private:
  using Trampoline = void (*)(const void* context, int64_t begin, int64_t end, int worker);
  void run_job(Trampoline call, const void* context, int64_t count, int64_t per_piece);
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  Trampoline call_ = nullptr;
  const void* context_ = nullptr;
  int64_t count_ = 0;
  int64_t per_piece_ = 0;
};

}  // namespace npusim::cpu
