#pragma once
#include <string>
#include <vector>

namespace npusim::cli {

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
