// The thread pool: every index covered exactly once by distinct workers, with and without the spin before sleeping,
// over many back-to-back jobs (the hot path between kernels) and after workers have gone to sleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.h"

namespace npusim::cpu {
namespace {

// Runs parallel_for(count, grain) and checks each index is visited once, pieces are grain multiples (but the last),
// there are at most size() pieces, and no worker id is used by two pieces at the same time.
void check_cover(ThreadPool& pool, int64_t count, int64_t grain) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(count));
  std::vector<std::atomic<int>> busy(static_cast<size_t>(pool.size()));
  std::atomic<int> bad_worker{0}, bad_piece{0}, shared_worker{0}, pieces{0};
  pool.parallel_for(count, grain, [&](int64_t begin, int64_t end, int worker) {
    if (worker < 0 || worker >= pool.size()) {
      bad_worker.fetch_add(1);
      return;
    }
    if (busy[static_cast<size_t>(worker)].exchange(1) != 0) shared_worker.fetch_add(1);
    pieces.fetch_add(1);
    if (begin >= end || (begin % std::max<int64_t>(grain, 1)) != 0 ||
        (end != count && (end - begin) % std::max<int64_t>(grain, 1) != 0))
      bad_piece.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) visits[static_cast<size_t>(i)].fetch_add(1);
    busy[static_cast<size_t>(worker)].store(0);
  });
  ASSERT_EQ(bad_worker.load(), 0);
  ASSERT_EQ(bad_piece.load(), 0) << "count=" << count << " grain=" << grain;
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(visits[static_cast<size_t>(i)].load(), 1) << "index " << i;
  ASSERT_EQ(shared_worker.load(), 0);
  ASSERT_LE(pieces.load(), pool.size());
}

class ThreadPoolTest : public ::testing::TestWithParam<int> {};  // the spin in microseconds

TEST_P(ThreadPoolTest, CoversEveryIndexOnceForManySizes) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    pool.set_spin_microseconds(GetParam());
    ASSERT_EQ(pool.size(), threads);
    for (int64_t count : {0, 1, 2, 3, 7, 16, 101})
      for (int64_t grain : {0, 1, 3, 8, 200}) {
        check_cover(pool, count, grain);
        if (testing::Test::HasFailure()) return;
      }
  }
}

TEST_P(ThreadPoolTest, ManyBackToBackJobsSumCorrectly) {
  ThreadPool pool(2);
  pool.set_spin_microseconds(GetParam());
  std::vector<int64_t> partial(2);
  for (int job = 0; job < 2000; ++job) {
    const int64_t count = 1 + job % 37;
    partial.assign(2, 0);
    pool.parallel_for(count, 1, [&](int64_t begin, int64_t end, int worker) {
      for (int64_t i = begin; i < end; ++i) partial[static_cast<size_t>(worker)] += i + job;
    });
    ASSERT_EQ(partial[0] + partial[1], count * (count - 1) / 2 + count * job) << "job " << job;
  }
}

TEST_P(ThreadPoolTest, WakesSleepingWorkers) {
  ThreadPool pool(3);
  pool.set_spin_microseconds(GetParam());
  for (int round = 0; round < 3; ++round) {
    // Longer than the spin: the workers are asleep when the next job comes.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // Each piece waits (boundedly) until all three run at once: only woken workers can make that happen.
    std::atomic<int> arrived{0}, all_met{0};
    pool.parallel_for(3, 1, [&](int64_t begin, int64_t end, int) {
      EXPECT_EQ(end - begin, 1);
      arrived.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (arrived.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      if (arrived.load() == 3) all_met.fetch_add(1);
    });
    ASSERT_EQ(all_met.load(), 3) << "round " << round;
  }
}

// parallel_claim: every unit once, with the run that holds it, by a worker no other piece uses at that time, and
// each piece's state made fresh (a piece counts its units in it).
TEST_P(ThreadPoolTest, ClaimsEveryUnitOnceWithItsRun) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    pool.set_spin_microseconds(GetParam());
    for (const std::vector<int64_t>& starts :
         std::vector<std::vector<int64_t>>{{0}, {0, 0}, {0, 1}, {0, 5}, {0, 3, 3, 10}, {0, 0, 7, 7, 8, 40}}) {
      const int runs = static_cast<int>(starts.size()) - 1;
      std::vector<std::atomic<int>> visits(static_cast<size_t>(starts.back()));
      std::vector<std::atomic<int>> busy(static_cast<size_t>(pool.size()));
      std::atomic<int> wrong_run{0}, shared_worker{0}, stale_state{0};
      struct Count {
        int64_t units = 0;
        int64_t last = -1;
      };
      pool.parallel_claim<Count>(starts.data(), runs, [&](Count& state, int run, int64_t unit, int worker) {
        if (busy[static_cast<size_t>(worker)].exchange(1) != 0) shared_worker.fetch_add(1);
        if (run < 0 || run >= runs || unit < starts[run] || unit >= starts[run + 1]) wrong_run.fetch_add(1);
        if (state.units == 0 && state.last != -1) stale_state.fetch_add(1);
        ++state.units;
        state.last = unit;
        visits[static_cast<size_t>(unit)].fetch_add(1);
        busy[static_cast<size_t>(worker)].store(0);
      });
      ASSERT_EQ(wrong_run.load(), 0);
      ASSERT_EQ(shared_worker.load(), 0);
      ASSERT_EQ(stale_state.load(), 0);
      for (size_t i = 0; i < visits.size(); ++i) ASSERT_EQ(visits[i].load(), 1) << "unit " << i << ", runs " << runs;
    }
  }
}

// Equal runs over [0, count), as many as there are threads or units: every unit once, on workers within the pool,
// never two at once on one worker.
TEST_P(ThreadPoolTest, ClaimsEveryUnitOfEqualRunsOnce) {
  for (int threads : {1, 2, 3})
    for (int64_t count : {0, 1, 2, 5, 64, 1001}) {
      ThreadPool pool(threads);
      pool.set_spin_microseconds(GetParam());
      std::vector<std::atomic<int>> visits(static_cast<size_t>(count));
      std::vector<std::atomic<int>> busy(static_cast<size_t>(pool.size()));
      std::atomic<int> bad_worker{0}, shared_worker{0};
      struct NoState {};
      pool.parallel_claim_units<NoState>(count, [&](NoState&, int64_t unit, int worker) {
        if (worker < 0 || worker >= pool.size()) {
          bad_worker.fetch_add(1);
          return;
        }
        if (busy[static_cast<size_t>(worker)].exchange(1) != 0) shared_worker.fetch_add(1);
        visits[static_cast<size_t>(unit)].fetch_add(1);
        busy[static_cast<size_t>(worker)].store(0);
      });
      ASSERT_EQ(bad_worker.load(), 0);
      ASSERT_EQ(shared_worker.load(), 0);
      for (size_t i = 0; i < visits.size(); ++i)
        ASSERT_EQ(visits[i].load(), 1) << "unit " << i << " of " << count << ", threads " << threads;
    }
}

// A piece held up on a unit leaves the rest of its run to the others: run 0's first unit waits (boundedly) until
// some other unit of run 0 has been claimed meanwhile, which only another piece can do.
TEST_P(ThreadPoolTest, ClaimsTheUnitsOfAPieceThatIsHeldUp) {
  ThreadPool pool(2);
  pool.set_spin_microseconds(GetParam());
  const std::vector<int64_t> starts{0, 20, 40};
  std::atomic<bool> holding{false};
  std::atomic<int> taken_meanwhile{0};
  struct NoState {};
  pool.parallel_claim<NoState>(starts.data(), 2, [&](NoState&, int run, int64_t unit, int) {
    if (run != 0) return;
    if (unit != 0) {
      if (holding.load()) taken_meanwhile.fetch_add(1);
      return;
    }
    holding.store(true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (taken_meanwhile.load() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    holding.store(false);
  });
  EXPECT_GT(taken_meanwhile.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Spins, ThreadPoolTest, ::testing::Values(0, 100));

// Also the race where a worker finishes the last piece, the caller returns and destroys the pool, and the worker's
// next look at the ticket already finds the stop.
TEST(ThreadPool, DestroysWhileWorkersSpinOrSleep) {
  for (int i = 0; i < 300; ++i) {
    ThreadPool pool(2);
    pool.parallel_for(2, 1, [](int64_t, int64_t, int) {});
    if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  ThreadPool idle(4);  // never given a job
  SUCCEED();
}

}  // namespace
}  // namespace npusim::cpu
