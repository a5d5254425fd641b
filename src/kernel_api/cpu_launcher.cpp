// CPU kernels: the generated C++ is built by the system compiler into a shared library, loaded with dlopen, and
// run over the grid. Without a barrier each thread of a group runs in turn and groups run on several worker
// threads; with threadgroup_barrier every thread of a group gets an OS thread, and the barrier blocks until all
// threads of the group still running have reached it.
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include "kernel_api/kernel_cache.h"
#include "kernel_api/launchers.h"
#include "kernel_api/source_gen.h"
#include "npusim/error.h"

extern char** environ;

namespace npusim::kernels::detail {

namespace {

// The most block-level shared memory a CPU threadgroup may ask for: what the largest current GPUs allow (H100),
// so that a kernel tried on the CPU fits a GPU too.
constexpr int64_t kCpuMaxSharedMemoryBytes = 227 * 1024;

using RunFn = void (*)(const npusim_cpu_launch*, const npusim_cpu_call*);

struct CpuModule {
  void* handle = nullptr;
  RunFn run = nullptr;
  unsigned max_threads = 0;
  GeneratedSource source;
  ~CpuModule() {
    if (handle) dlclose(handle);
  }
};

std::string compiler() {
  const char* chosen = std::getenv("NPUSIM_CXX");
  return chosen && *chosen ? chosen : "c++";
}

const std::vector<std::string>& compiler_flags() {
  static const std::vector<std::string> flags = {
      "-std=c++20", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-fvisibility-inlines-hidden"};
  return flags;
}

// Runs the compiler with its output in `log_path`; returns its exit status (127 when it could not start).
int run_compiler(const std::vector<std::string>& command, const std::filesystem::path& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> argv;
  for (const std::string& part : command) argv.push_back(const_cast<char*>(part.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return 127;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void remove_quietly(const std::filesystem::path& path) {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
}

std::shared_ptr<CpuModule> open_module(const Plan& plan, const std::filesystem::path& library, GeneratedSource source,
                                       std::string* problem) {
  auto module = std::make_shared<CpuModule>();
  module->source = std::move(source);
  module->handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!module->handle) {
    if (problem) *problem = dlerror();
    return nullptr;
  }
  using VersionFn = int (*)();
  using LimitFn = unsigned (*)();
  auto version = reinterpret_cast<VersionFn>(dlsym(module->handle, "npusim_cpu_abi_version"));
  auto limit = reinterpret_cast<LimitFn>(dlsym(module->handle, "npusim_max_threads_per_threadgroup"));
  module->run = reinterpret_cast<RunFn>(dlsym(module->handle, "npusim_run"));
  if (!version || !limit || !module->run || version() != kCpuAbiVersion) {
    if (problem) *problem = library.string() + " is not a kernel of this npusim version";
    return nullptr;
  }
  module->max_threads = limit();
  (void)plan;
  return module;
}

std::shared_ptr<CpuModule> build_module(const Plan& plan, const GeneratedSource& source) {
  std::vector<std::string> command = {compiler()};
  for (const std::string& flag : compiler_flags()) command.push_back(flag);
  std::string key_text = "cpu";
  for (const std::string& part : command) key_text += " " + part;
  key_text += "\n" + source.text;
  const std::string hash = hash_hex(key_text);

  return std::static_pointer_cast<CpuModule>(find_or_load("cpu:" + hash, [&]() -> std::shared_ptr<void> {
    const std::filesystem::path base = cache_folder() / (plan.source->name + "-" + hash);
    const std::filesystem::path source_path = base.string() + ".cpp", library_path = base.string() + ".so";
    if (read_file(source_path) == source.text && std::filesystem::exists(library_path)) {
      if (auto module = open_module(plan, library_path, source, nullptr)) {
        count(CacheEvent::DiskHit);
        return module;
      }
    }
    const std::filesystem::path temporary_source = temporary_path(base).string() + ".cpp";
    const std::filesystem::path temporary_library = temporary_path(base).string() + ".so";
    const std::filesystem::path log_path = temporary_path(base).string() + ".log";
    write_file_atomically(temporary_source, source.text);
    command.insert(command.end(), {"-o", temporary_library.string(), temporary_source.string()});
    const int status = run_compiler(command, log_path);
    const std::string log = read_file(log_path).value_or("");
    remove_quietly(log_path);
    if (status != 0) {
      remove_quietly(temporary_source);
      remove_quietly(temporary_library);
      if (status == 127 && log.empty())
        fail(plan.label() + ": cannot run the C++ compiler '" + command[0] + "' (set NPUSIM_CXX to one)");
      fail(explain_compile_errors(plan, source, log));
    }
    std::error_code error;
    std::filesystem::rename(temporary_library, library_path, error);
    if (!error) std::filesystem::rename(temporary_source, source_path, error);
    if (error) {
      remove_quietly(temporary_source);
      remove_quietly(temporary_library);
      fail(plan.label() + ": cannot store the compiled kernel in " + base.parent_path().string() + ": " +
           error.message());
    }
    std::string problem;
    auto module = open_module(plan, library_path, source, &problem);
    if (!module) fail(plan.label() + ": cannot load the compiled kernel: " + problem);
    count(CacheEvent::Compiled);
    return module;
  }));
}

// The first kernel_assert that failed, or the first exception a thread threw.
struct Failure {
  std::mutex mutex;
  bool assert_failed = false;
  int line = 0;
  unsigned x = 0, y = 0, z = 0;
  std::string exception;
};

void record_assert(void* state, int line, unsigned x, unsigned y, unsigned z) {
  auto* failure = static_cast<Failure*>(state);
  std::lock_guard lock(failure->mutex);
  if (failure->assert_failed) return;
  failure->assert_failed = true;
  failure->line = line;
  failure->x = x;
  failure->y = y;
  failure->z = z;
}

void record_exception(Failure& failure, const std::string& what) {
  std::lock_guard lock(failure.mutex);
  if (failure.exception.empty()) failure.exception = what;
}

void no_barrier(void*) {}

// The barrier of one threadgroup's threads. A thread that finishes the body stops counting for the barriers left
// in that group (as an exited CUDA thread does), so a thread that returns early never blocks the others.
class TeamBarrier {
 public:
  TeamBarrier(int size, std::vector<unsigned char>& shared_memory)
      : size_(size), active_(size), shared_(shared_memory) {}

  void wait() {
    std::unique_lock lock(mutex_);
    const uint64_t generation = generation_;
    if (++waiting_ == active_) {
      release();
      return;
    }
    changed_.wait(lock, [&] { return generation_ != generation; });
  }

  // Called by each thread after its body returns; returns once every thread of the group has finished, with the
  // shared memory poisoned again for the next group.
  void finish_group() {
    std::unique_lock lock(mutex_);
    const uint64_t group = group_;
    --active_;
    if (settle()) return;
    changed_.wait(lock, [&] { return group_ != group; });
  }

  // Threads that could not be started: the team goes on without them.
  void shrink(int missing) {
    std::lock_guard lock(mutex_);
    size_ -= missing;
    active_ -= missing;
    settle();
  }

 private:
  // After a thread stopped counting: ends the group when none is left, or releases a barrier all others reached.
  bool settle() {
    if (active_ == 0) {
      std::fill(shared_.begin(), shared_.end(), 0xff);
      active_ = size_;
      waiting_ = 0;
      ++group_;
      changed_.notify_all();
      return true;
    }
    if (waiting_ > 0 && waiting_ == active_) release();
    return false;
  }

  void release() {
    waiting_ = 0;
    ++generation_;
    changed_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  int size_;
  int active_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  uint64_t group_ = 0;
  std::vector<unsigned char>& shared_;
};

void barrier_wait(void* team) { static_cast<TeamBarrier*>(team)->wait(); }

npusim_cpu_call call_for(const Plan& plan, int64_t group, unsigned first, unsigned count, unsigned char* shared,
                         void* team) {
  npusim_cpu_call call{};
  call.group[0] = static_cast<unsigned>(group % plan.blocks.x);
  call.group[1] = static_cast<unsigned>(group / plan.blocks.x % plan.blocks.y);
  call.group[2] = static_cast<unsigned>(group / (plan.blocks.x * plan.blocks.y));
  call.first_thread = first;
  call.thread_count = count;
  call.shared_memory = shared;
  call.team = team;
  return call;
}

// Without barriers: groups are handed out to worker threads, each running all threads of a group in turn.
void run_groups(const Plan& plan, const CpuModule& module, const npusim_cpu_launch& launch, Failure& failure) {
  const int64_t groups = plan.total_threadgroups();
  const int64_t threads = groups * plan.threads_per_threadgroup();
  constexpr int64_t kThreadsPerWorker = 1 << 15;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = std::clamp<int64_t>(threads / kThreadsPerWorker, 1, std::min(hardware, groups));
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  auto work = [&] {
    std::vector<unsigned char> shared(static_cast<size_t>(plan.shared_memory_bytes), 0xff);
    const auto size = static_cast<unsigned>(plan.threads_per_threadgroup());
    const int64_t chunk = std::max<int64_t>(1, groups / (workers * 16));
    try {
      for (int64_t first = next.fetch_add(chunk); first < groups && !stop; first = next.fetch_add(chunk)) {
        for (int64_t g = first; g < std::min(groups, first + chunk); ++g) {
          const npusim_cpu_call call = call_for(plan, g, 0, size, shared.data(), nullptr);
          module.run(&launch, &call);
        }
      }
    } catch (const std::exception& error) {
      record_exception(failure, error.what());
      stop = true;
    }
  };
  if (workers == 1) {
    work();
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
}

// With barriers: one OS thread per thread of a group; the team runs the groups one after another.
void run_team(const Plan& plan, const CpuModule& module, const npusim_cpu_launch& launch, Failure& failure) {
  const int size = static_cast<int>(plan.threads_per_threadgroup());
  const int64_t groups = plan.total_threadgroups();
  std::vector<unsigned char> shared(static_cast<size_t>(plan.shared_memory_bytes), 0xff);
  TeamBarrier barrier(size, shared);
  std::atomic<bool> stop{false};
  auto member = [&](unsigned index) {
    for (int64_t g = 0; g < groups; ++g) {
      if (!stop) {
        try {
          const npusim_cpu_call call = call_for(plan, g, index, 1, shared.data(), &barrier);
          module.run(&launch, &call);
        } catch (const std::exception& error) {
          record_exception(failure, error.what());
          stop = true;
        }
      }
      barrier.finish_group();
    }
  };
  std::vector<std::thread> team;
  try {
    for (int t = 1; t < size; ++t) team.emplace_back(member, static_cast<unsigned>(t));
  } catch (const std::system_error& error) {
    stop = true;
    barrier.shrink(size - 1 - static_cast<int>(team.size()));
    member(0);
    for (std::thread& thread : team) thread.join();
    fail(plan.label() + ": cannot start " + std::to_string(size) + " threads for a threadgroup: " + error.what());
  }
  member(0);
  for (std::thread& thread : team) thread.join();
}

}  // namespace

std::string cpu_generated_source(const Plan& plan) { return generate_cpu_source(plan).text; }

void launch_cpu(const Plan& plan, std::vector<Tensor>& tensors, const ScalarBytes& scalars) {
  const GeneratedSource source = generate_cpu_source(plan);
  if (plan.verbose)
    std::cerr << "--- " << plan.label() << ": generated source ---\n"
              << source.text << "--- end of " << plan.label() << " ---\n";
  const std::shared_ptr<CpuModule> module = build_module(plan, source);

  const int64_t threads = plan.threads_per_threadgroup();
  if (threads > module->max_threads)
    fail(plan.label() + ": a threadgroup of " + std::to_string(threads) +
         " threads exceeds the compiled kernel's limit of " + std::to_string(module->max_threads) +
         " threads per threadgroup");
  if (plan.shared_memory_bytes > kCpuMaxSharedMemoryBytes)
    fail(plan.label() + ": " + std::to_string(plan.shared_memory_bytes) +
         " bytes of shared memory exceed the device limit of " + std::to_string(kCpuMaxSharedMemoryBytes) +
         " bytes per threadgroup");

  std::vector<void*> data(plan.params.size(), nullptr);
  for (size_t p = 0; p < plan.params.size(); ++p) {
    if (plan.params[p].scalar) continue;
    data[p] = plan.params[p].output ? static_cast<void*>(tensors[p].mutable_bytes())
                                    : const_cast<std::byte*>(tensors[p].bytes());
  }
  SlotStorage slots;
  fill_slots(plan, std::move(data), scalars, slots);

  Failure failure;
  npusim_cpu_launch launch{};
  launch.params = slots.pointers.data();
  const int64_t grid[3] = {plan.grid.x, plan.grid.y, plan.grid.z};
  const int64_t group[3] = {plan.threadgroup.x, plan.threadgroup.y, plan.threadgroup.z};
  const int64_t groups[3] = {plan.blocks.x, plan.blocks.y, plan.blocks.z};
  for (int d = 0; d < 3; ++d) {
    launch.grid[d] = static_cast<unsigned>(grid[d]);
    launch.group[d] = static_cast<unsigned>(group[d]);
    launch.groups[d] = static_cast<unsigned>(groups[d]);
  }
  const bool team = plan.uses_barrier && threads > 1;
  launch.barrier = team ? barrier_wait : no_barrier;
  launch.assert_failed = record_assert;
  launch.assert_state = &failure;

  if (team)
    run_team(plan, *module, launch, failure);
  else
    run_groups(plan, *module, launch, failure);

  if (!failure.exception.empty()) fail(plan.label() + ": the kernel threw an exception: " + failure.exception);
  if (failure.assert_failed)
    fail(plan.label() + ": kernel_assert failed at " + module->source.describe_line(failure.line) + " in thread (" +
         std::to_string(failure.x) + ", " + std::to_string(failure.y) + ", " + std::to_string(failure.z) +
         "):\n      " + module->source.line_text(failure.line));
}

}  // namespace npusim::kernels::detail
