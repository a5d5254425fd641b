#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace npusim::cli {

// When npusim's code started: before any static initializer of its own, right after the dynamic loader. Start-up
// (time to the first result) is counted from it.
std::chrono::steady_clock::time_point process_start();

int run_command(const std::vector<std::string>& args);
int verify_command(const std::vector<std::string>& args);
int ops_command(const std::vector<std::string>& args);
int compile_command(const std::vector<std::string>& args);
int inspect_command(const std::vector<std::string>& args);
int passes_command(const std::vector<std::string>& args);
int bisect_command(const std::vector<std::string>& args);
int kernel_command(const std::vector<std::string>& args);
int bench_command(const std::vector<std::string>& args);
int probe_command(const std::vector<std::string>& args);
int generate_command(const std::vector<std::string>& args);
int chat_command(const std::vector<std::string>& args);

}  // namespace npusim::cli
