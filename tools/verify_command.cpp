#include <cmath>
#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "runtime/compare.h"
#include "runtime/safetensors.h"

namespace npusim::cli {

namespace {

const std::vector<OptionSpec> kVerifyOptions = {
    {"min-pearson", true, "R: fail when Pearson r of any tensor is below R (default 0.999)"},
    {"max-abs", true, "D: fail when max |diff| of any tensor exceeds D"},
    {"top-k", true, "K: the k of the top-k agreement (default 5)"},
    {"help", false, "show this help"},
};

double parse_number(const Args& args, const std::string& name, double fallback) {
  auto text = args.value(name);
  if (!text) return fallback;
  try {
    size_t used = 0;
    const double value = std::stod(*text, &used);
    if (used == text->size()) return value;
  } catch (const std::exception&) {
  }
  fail("npusim verify: option '--" + name + "' needs a number, got '" + *text + "'");
}

}  // namespace

int verify_command(const std::vector<std::string>& argv) {
  const Args args("verify", kVerifyOptions, argv);
  if (args.flag("help")) {
    std::printf("usage: npusim verify ACTUAL.safetensors REFERENCE.safetensors [options]\n%s", args.usage().c_str());
    return 0;
  }
  if (args.positionals().size() != 2) fail("npusim verify: expected two .safetensors files (see npusim verify --help)");
  const double min_pearson = parse_number(args, "min-pearson", 0.999);
  const double max_abs = parse_number(args, "max-abs", INFINITY);
  const int top_k = static_cast<int>(args.integer("top-k", 5, 1, 1000));
  const SafetensorsFile actual = SafetensorsFile::open(args.positionals()[0]);
  const SafetensorsFile reference = SafetensorsFile::open(args.positionals()[1]);
  bool ok = true;
  int compared = 0;
  for (const std::string& name : reference.names()) {
    if (!actual.contains(name)) {
      std::printf("%-24s missing from %s\n", name.c_str(), actual.path().c_str());
      ok = false;
      continue;
    }
    const Comparison c = compare_tensors(actual.get(name), reference.get(name), top_k);
    const bool pass = c.pearson >= min_pearson && c.max_abs_diff <= max_abs;
    std::printf("%-24s %s  %s\n", name.c_str(), c.summary().c_str(), pass ? "OK" : "MISMATCH");
    ok = ok && pass;
    ++compared;
  }
  if (compared == 0) fail("npusim verify: no tensor names in common");
  return ok ? 0 : 1;
}

}  // namespace npusim::cli
