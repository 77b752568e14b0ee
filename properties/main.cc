// Property test main: 1000 cases per property unless RC_PARAMS says otherwise, and TS_CHECK
// failures turned into exceptions so RapidCheck reports them with a reproduce line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "engine/check.h"

int main(int argc, char** argv) {
  if (std::getenv("RC_PARAMS") == nullptr) setenv("RC_PARAMS", "max_success=1000", 1);
  twinstep::set_check_handler(
      [](const std::string& message) { throw std::logic_error("TS_CHECK: " + message); });
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
