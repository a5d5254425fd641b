#include "backends/cpu/thread_pool.h"

#include <algorithm>

namespace npusim::cpu {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::run_job(Trampoline call, const void* context, int64_t count, int64_t per_piece) {
  const int pieces = static_cast<int>((count + per_piece - 1) / per_piece);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    call_ = call;
    context_ = context;
    count_ = count;
    per_piece_ = per_piece;
    pending_ = pieces - 1;
    ++generation_;
  }
  wake_.notify_all();
  call(context, 0, std::min(count, per_piece), 0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  while (true) {
    Trampoline call;
    const void* context;
    int64_t begin, end;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      begin = index * per_piece_;
      if (begin >= count_) continue;  // fewer pieces than workers this time
      end = std::min(count_, begin + per_piece_);
      call = call_;
      context = context_;
    }
    call(context, begin, end, index);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace npusim::cpu
