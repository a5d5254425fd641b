#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace npusim::cli {

struct OptionSpec {
  std::string name;  // without the leading dashes
  bool takes_value;
  std::string help;
};

// Parsed command line of one subcommand. Unknown options, missing values and bad numbers are errors that
// name the subcommand and the option.
class Args {
 public:
  Args(std::string command, std::vector<OptionSpec> specs, const std::vector<std::string>& argv);

  const std::vector<std::string>& positionals() const { return positionals_; }
  bool flag(const std::string& name) const { return values_.count(name) != 0; }
  std::optional<std::string> value(const std::string& name) const;
  std::vector<std::string> values(const std::string& name) const;
  int64_t integer(const std::string& name, int64_t fallback, int64_t min_value, int64_t max_value) const;
  std::string usage() const;

 private:
  std::string command_;
  std::vector<OptionSpec> specs_;
  std::vector<std::string> positionals_;
  std::map<std::string, std::vector<std::string>> values_;
};

}  // namespace npusim::cli
