// Always-on assertions: a programmer error aborts with the values involved.
// Usage: TS_CHECK(a == b) << "a=" << a << " b=" << b;
// Tests may install a handler that throws instead, so a property test can report the failure
// (and the RapidCheck reproduce line) rather than dying.
#pragma once

#include <functional>
#include <sstream>
#include <string>

namespace twinstep {

using CheckHandler = std::function<void(const std::string& message)>;

// Returns the previous handler. The default handler prints the message and aborts.
CheckHandler set_check_handler(CheckHandler handler);

class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* condition);
  CheckMessage(const CheckMessage&) = delete;
  CheckMessage& operator=(const CheckMessage&) = delete;
  // Calls the handler. It may throw (tests only), hence noexcept(false).
  ~CheckMessage() noexcept(false);
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace twinstep

#define TS_CHECK(condition) \
  if (condition) {          \
  } else                    \
    ::twinstep::CheckMessage(__FILE__, __LINE__, #condition).stream()

#define TS_UNREACHABLE() TS_CHECK(false) << "unreachable "
