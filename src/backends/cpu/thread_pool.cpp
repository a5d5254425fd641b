#include "backends/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace npusim::cpu {

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until `done()` or `spin_ns` have passed; true when done() held. The clock is read only every few dozen
// pauses: it costs more than one.
template <typename Done>
bool spin_until(int64_t spin_ns, const Done& done) {
  if (done()) return true;
  if (spin_ns <= 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns);
  while (true) {
    for (int i = 0; i < 32; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

uint32_t ticket_generation(uint64_t ticket) { return static_cast<uint32_t>(ticket >> 32); }
int ticket_pieces(uint64_t ticket) { return static_cast<int>((ticket >> 16) & 0xffff); }
int ticket_next(uint64_t ticket) { return static_cast<int>(ticket & 0xffff); }

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  threads = std::min(threads, 0xffff);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true, std::memory_order_relaxed);
  const uint64_t old = ticket_.load(std::memory_order_relaxed);
  ticket_.store(static_cast<uint64_t>(ticket_generation(old) + 1) << 32, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_seq_cst);  // ordered before the waiter check in notify_all
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

uint32_t ThreadPool::run_pieces(uint64_t ticket, int worker) {
  while (ticket_next(ticket) < ticket_pieces(ticket)) {
    if (!ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;
    const int64_t begin = ticket_next(ticket) * per_piece_;
    call_(context_, begin, std::min(count_, begin + per_piece_), worker);
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == ticket_pieces(ticket)) done_.notify_all();
    ticket = ticket_.load(std::memory_order_acquire);
  }
  return ticket_generation(ticket);
}

void ThreadPool::run_job(Trampoline call, const void* context, int64_t count, int64_t per_piece) {
  const int pieces = static_cast<int>((count + per_piece - 1) / per_piece);
  call_ = call;
  context_ = context;
  count_ = count;
  per_piece_ = per_piece;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = ticket_generation(ticket_.load(std::memory_order_relaxed)) + 1;
  const uint64_t ticket = (static_cast<uint64_t>(generation) << 32) | (static_cast<uint64_t>(pieces) << 16);
  ticket_.store(ticket, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_seq_cst);  // ordered before the waiter check in notify_all
  wake_.notify_all();
  run_pieces(ticket, 0);
  const auto finished = [&] { return done_.load(std::memory_order_acquire) == pieces; };
  if (spin_until(spin_ns_.load(std::memory_order_relaxed), finished)) return;
  for (int done = done_.load(std::memory_order_acquire); done != pieces; done = done_.load(std::memory_order_acquire))
    done_.wait(done, std::memory_order_acquire);
}

void ThreadPool::worker_loop(int index) {
  uint32_t seen = 0;
  while (true) {
    // run_pieces may already have seen the stop ticket (it rereads the ticket after each piece).
    if (stopping_.load(std::memory_order_relaxed)) return;
    uint64_t ticket = ticket_.load(std::memory_order_acquire);
    if (ticket_generation(ticket) == seen) {
      const auto published = [&] {
        ticket = ticket_.load(std::memory_order_acquire);
        return ticket_generation(ticket) != seen;
      };
      if (!spin_until(spin_ns_.load(std::memory_order_relaxed), published)) {
        // wake_ is read before the ticket: a job published after that read changes wake_, so the wait returns.
        for (uint32_t wake = wake_.load(std::memory_order_acquire); !published();
             wake = wake_.load(std::memory_order_acquire))
          wake_.wait(wake, std::memory_order_acquire);
      }
    }
    if (stopping_.load(std::memory_order_relaxed)) return;
    seen = run_pieces(ticket, index);
  }
}

}  // namespace npusim::cpu
