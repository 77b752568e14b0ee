// Property test main: 8000 cases per property unless RC_PARAMS says otherwise, and TS_CHECK
// failures turned into exceptions so RapidCheck reports them with a reproduce line. Ends with
// the number of engine steps the run took (the scale the README quotes).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "engine/check.h"
#include "sim/harness.h"

int main(int argc, char** argv) {
  if (std::getenv("RC_PARAMS") == nullptr) setenv("RC_PARAMS", "max_success=8000", 1);
  twinstep::set_check_handler(
      [](const std::string& message) { throw std::logic_error("TS_CHECK: " + message); });
  testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  std::printf("properties: %llu engine steps\n",
              static_cast<unsigned long long>(twinstep::sim::Harness::steps_in_process()));
  return status;
}
