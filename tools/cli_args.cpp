#include "cli_args.h"

#include "npusim/error.h"

namespace npusim::cli {

Args::Args(std::string command, std::vector<OptionSpec> specs, const std::vector<std::string>& argv)
    : command_(std::move(command)), specs_(std::move(specs)) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.size() < 2 || arg.rfind("--", 0) != 0) {
      if (arg.size() > 1 && arg[0] == '-' && arg != "-") fail("npusim " + command_ + ": unknown option '" + arg + "'");
      positionals_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& candidate : specs_)
      if (candidate.name == name) spec = &candidate;
    if (!spec) fail("npusim " + command_ + ": unknown option '--" + name + "' (see npusim " + command_ + " --help)");
    if (!spec->takes_value) {
      if (inline_value) fail("npusim " + command_ + ": option '--" + name + "' takes no value");
      values_[name].push_back("");
      continue;
    }
    if (inline_value) {
      values_[name].push_back(*inline_value);
    } else {
      if (i + 1 >= argv.size()) fail("npusim " + command_ + ": option '--" + name + "' needs a value");
      values_[name].push_back(argv[++i]);
    }
  }
}

std::optional<std::string> Args::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  if (it->second.size() > 1) fail("npusim " + command_ + ": option '--" + name + "' given more than once");
  return it->second.front();
}

std::vector<std::string> Args::values(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::integer(const std::string& name, int64_t fallback, int64_t min_value, int64_t max_value) const {
  auto text = value(name);
  if (!text) return fallback;
  size_t used = 0;
  int64_t parsed = 0;
  try {
    parsed = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text->size())
    fail("npusim " + command_ + ": option '--" + name + "' needs an integer, got '" + *text + "'");
  if (parsed < min_value || parsed > max_value)
    fail("npusim " + command_ + ": option '--" + name + "' must be between " + std::to_string(min_value) + " and " +
         std::to_string(max_value) + ", got " + *text);
  return parsed;
}

std::string Args::usage() const {
  std::string text;
  for (const OptionSpec& spec : specs_)
    text += "  --" + spec.name + (spec.takes_value ? " VALUE" : "") +
            std::string(spec.name.size() < 18 ? 18 - spec.name.size() : 1, ' ') + spec.help + "\n";
  return text;
}

}  // namespace npusim::cli
