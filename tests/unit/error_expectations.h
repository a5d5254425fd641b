// Expecting an npusim::Error: the action must throw one whose message contains every fragment.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "npusim/error.h"

namespace npusim::test {

inline void expect_error(const std::function<void()>& action, const std::vector<std::string>& fragments) {
  try {
    action();
    ADD_FAILURE() << "no error was raised; expected one mentioning '" << fragments.front() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' missing from: " << message;
  }
}

}  // namespace npusim::test
