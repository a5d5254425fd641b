#pragma once
// A small persistent pool: the calling thread plus workers. One job at a time.
//
// A network runs a few hundred short parallel regions; waking a sleeping thread costs tens of microseconds each time.
// So workers (and the caller waiting for them) first spin for a short, bounded while on an atomic generation counter,
// staying hot between the kernels of one run, and only then sleep (atomic wait, a futex on Linux). Pieces are claimed
// from a shared counter, so a thread that is slow to start (asleep, or descheduled on a busy machine) leaves its piece
// to whoever is free, the caller included.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
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
  // `grain` (except the last); worker is in [0, size()) and distinct among pieces that run at the same time (one
  // thread may run several pieces one after the other). `fn` must not throw.
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

  // The most runs parallel_claim deals.
  static constexpr int kMaxClaimRuns = 256;

  // Calls fn(state, run, unit, worker) once for every unit of [0, starts[runs]), dealt as `runs` contiguous runs
  // (run r: [starts[r], starts[r + 1])), one to each piece: a piece claims the units of its own run in order, so that
  // it reads one sequential stream, then goes on to claim the units left in the other runs, so that a thread that
  // starts late or runs slower (a busy machine, a core shared with another guest) does less instead of holding up
  // the rest. `state` is a State made for each piece, for what a piece keeps from one unit to the next. At most
  // kMaxClaimRuns runs; `fn` must not throw.
  template <typename State, typename Fn>
  void parallel_claim(const int64_t* starts, int runs, const Fn& fn) {
    struct alignas(64) Cursor {  // one cache line each: a claim does not disturb the other threads' lines
      std::atomic<int64_t> next;
    };
    std::array<Cursor, kMaxClaimRuns> cursors;
    runs = std::clamp(runs, 0, kMaxClaimRuns);
    for (int r = 0; r < runs; ++r) cursors[r].next.store(starts[r], std::memory_order_relaxed);
    parallel_for(runs, 1, [&](int64_t own, int64_t, int worker) {
      State state{};
      for (int step = 0; step < runs; ++step) {
        const int r = static_cast<int>((own + step) % runs);
        for (int64_t unit = cursors[r].next.fetch_add(1, std::memory_order_relaxed); unit < starts[r + 1];
             unit = cursors[r].next.fetch_add(1, std::memory_order_relaxed))
          fn(state, r, unit, worker);
      }
    });
  }

  // parallel_claim over [0, count) dealt as one equal run per thread (fewer when count is smaller): fn(state, unit,
  // worker) for units whose costs are alike.
  template <typename State, typename Fn>
  void parallel_claim_units(int64_t count, const Fn& fn) {
    const int runs = static_cast<int>(std::min<int64_t>({size(), kMaxClaimRuns, count}));
    if (runs <= 1) {
      State state{};
      for (int64_t unit = 0; unit < count; ++unit) fn(state, unit, 0);
      return;
    }
    std::array<int64_t, kMaxClaimRuns + 1> starts;
    for (int r = 0; r <= runs; ++r) starts[r] = count * r / runs;
    parallel_claim<State>(starts.data(), runs,
                          [&](State& state, int, int64_t unit, int worker) { fn(state, unit, worker); });
  }

  // How long an idle worker (and the caller waiting for its workers) spins before it sleeps; 0 sleeps at once.
  // For tests and measurements.
  void set_spin_microseconds(int64_t microseconds) {
    spin_ns_.store(std::max<int64_t>(0, microseconds) * 1000, std::memory_order_relaxed);
  }

 private:
  using Trampoline = void (*)(const void* context, int64_t begin, int64_t end, int worker);
  void run_job(Trampoline call, const void* context, int64_t count, int64_t per_piece);
  void worker_loop(int index);
  // Claims and runs pieces of the job in `ticket` (refreshed as it goes) until none is left; the job last seen.
  uint32_t run_pieces(uint64_t ticket, int worker);

  std::vector<std::thread> workers_;
  // The job ticket: generation (high 32 bits), pieces (16 bits), next unclaimed piece (low 16 bits). A new job (or
  // the stop) is published by storing a new generation after the job's fields are written; claiming a piece is a
  // compare-and-swap on the ticket, so a piece is only ever claimed for the job its fields describe.
  std::atomic<uint64_t> ticket_{0};
  // Bumped after each new ticket; sleeping workers wait on it. 32 bits: a wait on it is a plain futex wait on its own
  // address (64-bit waits go through a proxy shared in libstdc++).
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> done_{0};  // pieces of the current job finished
  std::atomic<bool> stopping_{false};
  // 300 us: on a 2-vCPU virtual machine with steal time, a worker that slept after 20 us was slow to wake between two
  // kernels: ResNet-50 on 2 threads took 51.0 ms (median of 8 alternated rounds' medians) against 44.5 ms with 300 us.
  std::atomic<int64_t> spin_ns_{300'000};  // idle workers read it
  Trampoline call_ = nullptr;
  const void* context_ = nullptr;
  int64_t count_ = 0;
  int64_t per_piece_ = 0;
};

}  // namespace npusim::cpu
